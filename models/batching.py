"""Turn sentences into padded causal-LM batches. Labels are -100 on padding so it never counts."""

from __future__ import annotations

from typing import Iterator, Sequence

import torch
from transformers import PreTrainedTokenizerBase

IGNORE = -100


def encode(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_len: int) -> list[torch.Tensor]:
    """One id tensor per text: the text's tokens followed by EOS, truncated to ``max_len``."""
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return [torch.tensor((row + [eos])[:max_len], dtype=torch.long) for row in ids]


def collate(sequences: Sequence[torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    labels = torch.full((len(sequences), width), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        input_ids[row, : len(seq)] = seq
        labels[row, : len(seq)] = seq
        attention[row, : len(seq)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}


def batches(
    sequences: Sequence[torch.Tensor], batch_size: int, pad_id: int, generator: torch.Generator | None = None
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches in order, or shuffled with ``generator``."""
    order = torch.randperm(len(sequences), generator=generator).tolist() if generator else range(len(sequences))
    order = list(order)
    for start in range(0, len(order), batch_size):
        yield collate([sequences[i] for i in order[start : start + batch_size]], pad_id)
