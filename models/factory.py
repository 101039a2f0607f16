"""One entry point from a model kind (``gpt2``, ``llama``, ``lstm``, ``bert``, ``causal-lm``, ``classifier``)
and a size preset or checkpoint folder to a torch model, and what it is trained for: next-word prediction or
sequence classification."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from uedp.errors import UedpError
from uedp.models.presets import (
    BERT_PRESETS,
    LLAMA_PRESETS,
    LSTM_PRESETS,
    PRESETS,
    SIZE_PRESETS,
    ModelKind,
    Task,
    task_of,
)

__all__ = ["SIZE_PRESETS", "ModelKind", "Task", "build_model", "task_of"]


def build_model(kind: ModelKind, size: str, tokenizer: PreTrainedTokenizerBase,
                num_labels: int | None = None) -> torch.nn.Module:
    """A preset size is built from scratch (seeded by torch's generator); anything else is loaded as a
    checkpoint folder (or a hub name where downloads are possible)."""
    vocab_size, eos_id = len(tokenizer), tokenizer.eos_token_id
    if kind == "lstm-classifier":  # the LSTM with a head over classes (UeDP's AG News classifier)
        from uedp.models.lstm import build_lstm_classifier

        if num_labels is None:
            raise ValueError("a classifier needs the number of classes")
        if size in LSTM_PRESETS:
            return build_lstm_classifier(size, vocab_size, num_labels)
        return _saved_lstm(Path(size), num_labels)
    if kind == "lstm":
        from uedp.models.lstm import build_lstm

        return build_lstm(size, vocab_size) if size in LSTM_PRESETS else _saved_lstm(Path(size), None)
    if kind == "gpt2":
        from uedp.models.gpt2 import build_gpt2, load_gpt2

        model: torch.nn.Module = build_gpt2(size, vocab_size, eos_id) if size in PRESETS else load_gpt2(size)
    elif kind == "llama" and size in LLAMA_PRESETS:
        from uedp.models.causal_lm import build_llama

        return build_llama(size, vocab_size, eos_id)
    elif task_of(kind) == "lm":  # llama or causal-lm with a folder
        from uedp.models.causal_lm import load_causal_lm

        model = load_causal_lm(size)
    else:
        from uedp.models.classifier import build_bert_classifier, load_classifier

        if num_labels is None:
            raise ValueError("a classifier needs the number of classes")
        if kind == "bert" and size in BERT_PRESETS:
            return build_bert_classifier(size, vocab_size, num_labels, tokenizer.pad_token_id)
        model = load_classifier(size, num_labels)
    check_vocabulary(model, tokenizer, size)
    return model


def check_vocabulary(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, checkpoint: str) -> None:
    """Every token id the tokenizer makes must have a row in the checkpoint's embedding."""
    embedding = model.get_input_embeddings()  # type: ignore[operator]
    if len(tokenizer) > embedding.num_embeddings:
        raise UedpError(f"{checkpoint}: the tokenizer makes {len(tokenizer)} token ids but the checkpoint's embedding "
                        f"has {embedding.num_embeddings} rows; use the checkpoint's own tokenizer (--tokenizer {checkpoint})")


def _saved_lstm(folder: Path, num_labels: int | None) -> torch.nn.Module:
    """A saved LSTM of the kind asked for: a language model (``num_labels`` None) or a classifier over
    that many classes. The folder's own configuration says which it holds; the other is refused, naming it."""
    from uedp.models.lstm import LstmClassifier, load_lstm

    model = load_lstm(folder)
    held = model.lstm_config.num_labels if isinstance(model, LstmClassifier) else None
    if held != num_labels:
        what = f"a classifier over {held} classes" if held else "a language model"
        asked = f"a classifier over {num_labels} classes" if num_labels else "a language model"
        raise UedpError(f"{folder} holds {what}, not {asked} (--model lstm-classifier for a classifier, lstm for a "
                        "language model; a classifier's classes must be the dataset's)")
    return model
