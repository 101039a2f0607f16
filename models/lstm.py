"""A one-layer LSTM language model: the Selective-DP paper's recurrent model (embedding 200, hidden 200).

The recurrence is Opacus' ``DPLSTM``, a drop-in ``nn.LSTM`` built from linear layers, so one and the
same architecture trains under every mechanism: per-example gradients exist for its linear layers
(``nn.LSTM``'s fused kernel has no per-sample gradient rule), and noiseless training of the identical
model keeps the privacy-utility comparison fair.

The forward signature is that of a Hugging Face causal LM (``input_ids``, ``attention_mask``,
``position_ids`` in, ``.logits`` out), so the loss functions and metrics of ``models.metrics`` serve
GPT-2 and the LSTM alike. Batches are right-padded: padding follows every real token and therefore
never influences a prediction of a real one, which is why the mask is not needed.

:class:`LstmClassifier` is the same recurrence with a linear head over classes instead of the decoder
(the UeDP paper's AG News classifier: an LSTM with a softmax layer on top): it reads the state after
each sequence's last real token, the one place the attention mask is needed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from opacus.layers import DPLSTM
from torch import nn
from transformers.modeling_outputs import CausalLMOutput, SequenceClassifierOutput

from uedp.errors import UedpError
from uedp.models.presets import LSTM_PRESETS

WEIGHTS = "lstm.pt"
CONFIG = "lstm_config.json"


@dataclass(frozen=True)
class LstmConfig:
    vocab_size: int
    embedding_size: int = 200
    hidden_size: int = 200
    tie_weights: bool = False
    num_labels: int = 0  # > 0: a sequence classifier over this many classes (LstmClassifier)


class LstmLanguageModel(nn.Module):
    """Embedding -> one LSTM layer -> linear decoder over the vocabulary."""

    def __init__(self, config: LstmConfig):
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.embedding_size)
        self.lstm = DPLSTM(config.embedding_size, config.hidden_size, num_layers=1, batch_first=True)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        if config.tie_weights:
            if config.embedding_size != config.hidden_size:
                raise UedpError("tied LSTM weights need embedding_size == hidden_size")
            self.decoder.weight = self.embedding.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> CausalLMOutput:
        hidden, _ = self.lstm(self.embedding(input_ids))
        return CausalLMOutput(logits=self.decoder(hidden))

    def forward_releasing_states(self, input_ids: torch.Tensor, private: torch.Tensor,
                                 release: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int],
                                                   tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Logits of an unrolled forward pass in which the state after each private token is handed to
        ``release(h, c, rows, t)`` before the next token sees it (Selective-DPSGD clips and noises it there).

        ``private`` is a (batch, length) bool mask; ``rows`` are the batch rows private at step ``t``. The
        prediction at a private position itself uses the state before release. The cell is Opacus'
        ``DPLSTMCell``, called step by step exactly as ``DPLSTM`` calls it, so per-example gradients work.
        """
        cell = self.lstm.l0
        batch, length = input_ids.shape
        cell.set_max_batch_length(batch)
        embedded = self.embedding(input_ids)
        h = embedded.new_zeros(batch, self.config.hidden_size)
        c = embedded.new_zeros(batch, self.config.hidden_size)
        outputs = []
        for t in range(length):
            h, c = cell(embedded[:, t], (h, c))
            outputs.append(h)
            rows = private[:, t].nonzero(as_tuple=True)[0]
            if len(rows):
                released_h, released_c = release(h[rows], c[rows], rows, t)
                h, c = h.index_put((rows,), released_h), c.index_put((rows,), released_c)
        logits: torch.Tensor = self.decoder(torch.stack(outputs, dim=1))
        return logits

    def save_pretrained(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG).write_text(json.dumps(asdict(self.config), indent=2), encoding="utf-8")
        torch.save(self.state_dict(), folder / WEIGHTS)


class LstmClassifier(nn.Module):
    """Embedding -> one LSTM layer -> the state after each sequence's last real token -> linear over the
    classes (softmax in the loss)."""

    def __init__(self, config: LstmConfig):
        super().__init__()
        if config.num_labels < 1:
            raise UedpError("an LSTM classifier needs at least one class (num_labels)")
        # Not ``config``: code written for Hugging Face classifiers reads ``model.config.pad_token_id`` to find
        # each row's last token, which this model finds from the attention mask instead.
        self.lstm_config = config
        self.embedding = nn.Embedding(config.vocab_size, config.embedding_size)
        self.lstm = DPLSTM(config.embedding_size, config.hidden_size, num_layers=1, batch_first=True)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> SequenceClassifierOutput:
        hidden, _ = self.lstm(self.embedding(input_ids))
        # Right-padded rows: the last real token is at (number of real tokens - 1); without a mask every
        # token is real. A state after padding would depend on how long the batch's longest row is.
        if attention_mask is None:
            last = torch.full((input_ids.shape[0],), input_ids.shape[1] - 1, device=input_ids.device)
        else:
            last = (attention_mask.sum(dim=1) - 1).clamp(min=0)
        final = hidden[torch.arange(input_ids.shape[0], device=input_ids.device), last]
        return SequenceClassifierOutput(logits=self.classifier(final))

    def save_pretrained(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG).write_text(json.dumps(asdict(self.lstm_config), indent=2), encoding="utf-8")
        torch.save(self.state_dict(), folder / WEIGHTS)


def build_lstm(preset: str, vocab_size: int) -> LstmLanguageModel:
    if preset not in LSTM_PRESETS:
        raise UedpError(f"unknown LSTM preset {preset!r}; valid: {', '.join(LSTM_PRESETS)}")
    return LstmLanguageModel(LstmConfig(vocab_size=vocab_size, **LSTM_PRESETS[preset]))


def build_lstm_classifier(preset: str, vocab_size: int, num_labels: int) -> LstmClassifier:
    if preset not in LSTM_PRESETS:
        raise UedpError(f"unknown LSTM preset {preset!r}; valid: {', '.join(LSTM_PRESETS)}")
    return LstmClassifier(LstmConfig(vocab_size=vocab_size, num_labels=num_labels, **LSTM_PRESETS[preset]))


def load_lstm(folder: str | Path) -> LstmLanguageModel | LstmClassifier:
    """An LSTM saved by ``save_pretrained``: the language model, or the classifier when its configuration
    names classes (configurations saved before classifiers existed name none)."""
    folder = Path(folder)
    if not (folder / CONFIG).is_file():
        raise UedpError(f"{folder} is not a saved uedp LSTM (no {CONFIG}); presets: {', '.join(LSTM_PRESETS)}")
    config = LstmConfig(**json.loads((folder / CONFIG).read_text(encoding="utf-8")))
    model = LstmClassifier(config) if config.num_labels else LstmLanguageModel(config)
    model.load_state_dict(torch.load(folder / WEIGHTS, map_location="cpu", weights_only=True))
    return model
