"""One entry point from a model name (``gpt2``, ``lstm``, ``bert``) and a size or checkpoint to a
torch model, and what it is trained for: next-word prediction or sequence classification."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from uedp.models.classifier import build_bert_classifier, load_classifier
from uedp.models.gpt2 import build_gpt2, load_gpt2
from uedp.models.lstm import build_lstm, load_lstm
from uedp.models.presets import BERT_PRESETS, LSTM_PRESETS, PRESETS, SIZE_PRESETS, ModelKind, Task, task_of

__all__ = ["SIZE_PRESETS", "ModelKind", "Task", "build_model", "task_of"]


def build_model(kind: ModelKind, size: str, tokenizer: PreTrainedTokenizerBase,
                num_labels: int | None = None) -> torch.nn.Module:
    """A preset size is built from scratch (seeded by torch's generator); anything else is loaded as a
    checkpoint (a local folder, or a hub name where downloads are possible)."""
    vocab_size, eos_id = len(tokenizer), tokenizer.eos_token_id
    if kind == "gpt2":
        return build_gpt2(size, vocab_size, eos_id) if size in PRESETS else load_gpt2(size)
    if kind == "lstm":
        return build_lstm(size, vocab_size) if size in LSTM_PRESETS else load_lstm(Path(size))
    if num_labels is None:
        raise ValueError("a classifier needs the number of classes")
    if size in BERT_PRESETS:
        return build_bert_classifier(size, vocab_size, num_labels, tokenizer.pad_token_id)
    return load_classifier(size, num_labels)
