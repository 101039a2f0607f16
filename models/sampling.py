"""Sampling text from a causal language model: temperature and nucleus (top-p) sampling, one token at a
time, for every model kind uedp trains (GPT-2 and other Hugging Face causal LMs, LoRA adapters, the LSTM).

The loop calls the model on the whole prefix at each step rather than keeping a key/value cache: the LSTM
and a peft-wrapped model have no common cache interface, and the sequences uedp trains are short
(``max_len`` tokens). Prompts of one batch have the same length, so no padding enters a prefix (a padded
prefix would need position ids every model kind reads the same way); callers group prompts by length.

Every draw comes from the ``torch.Generator`` passed in, so a seed gives the same texts again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingSettings:
    """How each next token is drawn. ``temperature`` 0 is greedy decoding (the most likely token)."""

    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 0.95

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def next_tokens(logits: torch.Tensor, settings: SamplingSettings, generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``logits`` (rows x vocabulary): the smallest set of most likely tokens whose
    probability reaches ``top_p`` (always at least the most likely one), renormalised, at ``temperature``."""
    logits = logits.float()
    if settings.temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / settings.temperature, dim=-1)
    if settings.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ranked above each one
        sorted_probs = sorted_probs.masked_fill(before >= settings.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    drawn = torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1)
    return drawn.to(logits.device)


@torch.no_grad()
def continue_prompts(model: torch.nn.Module, prompts: torch.Tensor, eos_id: int, settings: SamplingSettings,
                     generator: torch.Generator) -> list[list[int]]:
    """Each row of ``prompts`` (rows x length, one length for all) continued until it draws ``eos_id`` or
    has ``max_new_tokens`` new tokens; returns the new tokens of each row, the EOS left out."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids = prompts.to(device)
    done = torch.zeros(ids.size(0), dtype=torch.bool, device=device)
    try:
        for _ in range(settings.max_new_tokens):
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[:, -1, :]
            token = next_tokens(logits, settings, generator)
            token = torch.where(done, torch.full_like(token, eos_id), token)
            ids = torch.cat([ids, token[:, None]], dim=1)
            done |= token == eos_id
            if bool(done.all()):
                break
    finally:
        model.train(was_training)
    new = ids[:, prompts.size(1):].tolist()
    return [row[: row.index(eos_id)] if eos_id in row else row for row in new]


def sample_texts(model: torch.nn.Module, tokenizer: object, prompts: Sequence[str], settings: SamplingSettings,
                 generator: torch.Generator, batch_size: int = 32,
                 on_batch: Callable[[int], object] | None = None) -> list[str]:
    """One text per prompt: the prompt followed by the model's continuation. An empty prompt starts after
    the end-of-text token (uedp encodes a text as its tokens and EOS, so EOS is where one text ends and the
    next may begin). ``on_batch`` is called with the number of texts each batch finished."""
    eos = int(tokenizer.eos_token_id)  # type: ignore[attr-defined]
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] if p else [] for p in prompts]  # type: ignore[operator]
    starts = [ids or [eos] for ids in encoded]
    by_length: dict[int, list[int]] = {}
    for index, ids in enumerate(starts):
        by_length.setdefault(len(ids), []).append(index)
    texts = [""] * len(prompts)
    for length in sorted(by_length):
        rows = by_length[length]
        for first in range(0, len(rows), batch_size):
            chunk = rows[first:first + batch_size]
            batch = torch.tensor([starts[i] for i in chunk], dtype=torch.long)
            for index, new in zip(chunk, continue_prompts(model, batch, eos, settings, generator)):
                texts[index] = tokenizer.decode(encoded[index] + new, skip_special_tokens=True).strip()  # type: ignore[attr-defined]
            if on_batch is not None:
                on_batch(len(chunk))
    return texts
