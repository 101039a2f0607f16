"""Turn examples into padded batches.

An example is a token-id tensor (language modelling: labels are the ids, -100 on padding so it never
counts) or a ``(token ids, class)`` pair (classification: labels are the classes). Mechanisms hold
examples in lists and never look inside them, so every mechanism trains either kind of model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Union

import numpy as np
import torch

if TYPE_CHECKING:  # transformers is heavy to import; only its tokenizer type is named here
    from transformers import PreTrainedTokenizerBase

IGNORE = -100
Example = Union[torch.Tensor, tuple[torch.Tensor, int]]


def encode(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_len: int) -> list[torch.Tensor]:
    """One id tensor per text: the text's tokens followed by EOS, truncated to ``max_len``."""
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return [torch.tensor((row + [eos])[:max_len], dtype=torch.long) for row in ids]


def encode_with_private_mask(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str],
                             spans: Sequence[Sequence[tuple[int, int]]], max_len: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``encode``'s ids, and per text a bool mask marking tokens that overlap one of its character spans
    (from the tokenizer's offsets; the appended EOS is never private)."""
    encoded = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
    ids_out, masks = [], []
    for row, offsets, text_spans in zip(encoded["input_ids"], encoded["offset_mapping"], spans):
        mask = [any(start < span_end and span_start < end for span_start, span_end in text_spans)
                for start, end in offsets] + [False]
        ids_out.append(torch.tensor((row + [tokenizer.eos_token_id])[:max_len], dtype=torch.long))
        masks.append(torch.tensor(mask[:max_len], dtype=torch.bool))
    return ids_out, masks


def pack_consecutive(sequences: Sequence[Example], max_tokens: int) -> list[torch.Tensor]:
    """One writer's sentences (each its ids and EOS, in the writer's order) packed into chunks of at most
    ``max_tokens`` tokens: consecutive sentences share a chunk while they fit, and none is split (each was
    truncated to the model's length when encoded; a longer one is cut here). A language model then reads a
    writer's text as it was written, with its EOS between sentences, and a batch of chunks holds far
    fewer padding tokens than a batch of short sentences.

    Only language-model examples pack: a classifier's (ids, class) pairs keep one class per sequence."""
    if max_tokens < 1:
        raise ValueError(f"chunks need at least one token (max_tokens {max_tokens})")
    chunks: list[torch.Tensor] = []
    current: list[torch.Tensor] = []
    length = 0
    for example in sequences:
        if isinstance(example, tuple):
            raise ValueError("only language-model sentences pack into chunks (a classifier's example has one class)")
        ids = example[:max_tokens]
        if current and length + len(ids) > max_tokens:
            chunks.append(torch.cat(current))
            current, length = [], 0
        current.append(ids)
        length += len(ids)
    if current:
        chunks.append(torch.cat(current))
    return chunks


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (per token, or one class per row)."""
    classes = [e[1] for e in examples] if isinstance(examples[0], tuple) else None
    sequences = [e[0] if isinstance(e, tuple) else e for e in examples]
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    labels = torch.full((len(sequences), width), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        input_ids[row, : len(seq)] = seq
        labels[row, : len(seq)] = seq
        attention[row, : len(seq)] = 1
    if classes is not None:
        labels = torch.tensor(classes, dtype=torch.long)
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention}


def example_length(example: Example) -> int:
    """Tokens of an example (a classification pair: of its ids)."""
    return len(example[0] if isinstance(example, tuple) else example)


PADDING_SHARE = 0.25  # a like-length group pads at most this share of its real tokens


def like_length_groups(examples: Sequence[Example], most: int | None = None,
                       padding: float = PADDING_SHARE) -> list[list[Example]]:
    """``examples`` in groups of like lengths, shortest first, each padded to its own longest by at most
    ``padding`` times its real tokens, and of at most ``most`` examples.

    A batch is padded to its longest example, so a batch of CoNLL-2003 sentences (3 to 64 tokens) spends
    most of each pass on padding: 62% of a Poisson batch of 64 from SmolLM2's tokenizer. Where the batch's
    examples are summed one by one (DP-SGD's clipped per-example gradients) or scored one by one
    (evaluation), groups of like lengths give the same sum in a fraction of the computation (measured:
    ``benchmarks/length_groups.py``). A single example longer than every other is a group of its own."""
    ordered = sorted(examples, key=example_length)
    groups: list[list[Example]] = []
    real = 0
    for example in ordered:
        length = example_length(example)
        group = groups[-1] if groups else None
        if (group is not None and (most is None or len(group) < most)
                and (len(group) + 1) * length <= (1 + padding) * (real + length)):
            group.append(example)
            real += length
        else:
            groups.append([example])
            real = length
    return groups


def padded_tokens(groups: Sequence[Sequence[Example]]) -> int:
    """Token positions a pass over each group computes: its examples times its longest."""
    return sum(len(group) * max(map(example_length, group)) for group in groups if group)


def batches(
    sequences: Sequence[Example], batch_size: int, pad_id: int,
    generator: torch.Generator | np.random.Generator | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Batches in order, or shuffled with ``generator`` (a torch or a numpy generator)."""
    for examples in example_batches(sequences, batch_size, generator):
        yield collate(examples, pad_id)


def example_batches(
    sequences: Sequence[Example], batch_size: int,
    generator: torch.Generator | np.random.Generator | None = None,
) -> Iterator[list[Example]]:
    """:func:`batches` before collation: the examples of each batch, in the same order for the same draws."""
    if generator is None:
        order = list(range(len(sequences)))
    elif isinstance(generator, np.random.Generator):
        order = generator.permutation(len(sequences)).tolist()
    else:
        order = torch.randperm(len(sequences), generator=generator).tolist()
    for start in range(0, len(order), batch_size):
        yield [sequences[i] for i in order[start : start + batch_size]]


class ShuffledBatches:
    """Endless batches of indices, reshuffled each epoch, whose position can be saved and restored.

    Its state is the generator's state at the start of the current epoch plus the position within
    the epoch, so a run resumed from a checkpoint draws exactly the batches the original would have.
    """

    def __init__(self, n: int, batch_size: int, generator: torch.Generator):
        if n < 1:
            raise ValueError("no training examples")
        self.n, self.batch_size, self.generator = n, batch_size, generator
        self._epoch_start = generator.get_state()
        self._order = torch.randperm(n, generator=generator).tolist()
        self._position = 0

    def next(self) -> list[int]:
        if self._position >= self.n:
            self._epoch_start = self.generator.get_state()
            self._order = torch.randperm(self.n, generator=self.generator).tolist()
            self._position = 0
        indices = self._order[self._position:self._position + self.batch_size]
        self._position += len(indices)
        return indices

    def state_dict(self) -> dict[str, object]:
        return {"epoch_start": self._epoch_start, "position": self._position}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.generator.set_state(state["epoch_start"])  # type: ignore[arg-type]
        self._epoch_start = self.generator.get_state()
        self._order = torch.randperm(self.n, generator=self.generator).tolist()
        self._position = int(state["position"])  # type: ignore[call-overload]
