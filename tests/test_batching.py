"""Examples into batches (models/batching.py): how a text becomes ids, which tokens count, how batches are padded,
and the noiseless sampler's resumable order. Every mechanism trains on what these make, and a resumed noiseless
run must draw exactly the batches the uninterrupted one would have."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from uedp.models.batching import (
    IGNORE,
    PADDING_SHARE,
    ShuffledBatches,
    batches,
    collate,
    encode,
    encode_with_private_mask,
    example_length,
    like_length_groups,
)
from uedp.models.metrics import perplexity, sequence_nll

from support import TOKENIZER

EOS = TOKENIZER.eos_token_id
PAD = TOKENIZER.pad_token_id


def test_a_text_is_its_tokens_then_eos_cut_to_the_length() -> None:
    (whole, cut) = encode(TOKENIZER, ["Leeds", "Peter Okafor"], 8)
    assert whole.tolist() == [*TOKENIZER("Leeds", add_special_tokens=False)["input_ids"], EOS]
    assert len(cut) == 8 and EOS not in cut.tolist()  # cut: the end mark is past the length
    assert encode(TOKENIZER, [""], 8)[0].tolist() == [EOS]


def test_private_masks_mark_the_tokens_a_span_touches_and_never_the_end_mark() -> None:
    text = "Call Ann now"
    ids, masks = encode_with_private_mask(TOKENIZER, [text], [[(5, 8)]], 32)
    assert ids[0].tolist() == encode(TOKENIZER, [text], 32)[0].tolist()
    marked = [TOKENIZER.decode([i]) for i, m in zip(ids[0].tolist(), masks[0].tolist()) if m]
    assert "".join(marked) == "Ann" and not masks[0][-1]
    _, none = encode_with_private_mask(TOKENIZER, [text], [[]], 32)
    assert not none[0].any()
    _, cut = encode_with_private_mask(TOKENIZER, [text], [[(0, 4)]], 3)
    assert cut[0].tolist() == [True, True, True]  # cut with its ids


def test_a_batch_is_right_padded_and_padding_never_counts() -> None:
    batch = collate([torch.tensor([5, 6, 7]), torch.tensor([8])], PAD)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, PAD, PAD]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7], [8, IGNORE, IGNORE]]


def test_a_classifiers_batch_has_one_label_per_row() -> None:
    batch = collate([(torch.tensor([5, 6]), 2), (torch.tensor([7]), 0)], PAD)
    assert batch["labels"].tolist() == [2, 0] and batch["input_ids"].tolist() == [[5, 6], [7, PAD]]


def test_batches_in_order_or_shuffled_cover_every_example_once() -> None:
    sequences = [torch.tensor([i + 1]) for i in range(10)]
    ordered = [b["input_ids"][:, 0].tolist() for b in batches(sequences, 4, PAD)]
    assert ordered == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    for generator in (torch.Generator().manual_seed(3), np.random.default_rng(3)):
        drawn = [x for b in batches(sequences, 4, PAD, generator) for x in b["input_ids"][:, 0].tolist()]
        assert sorted(drawn) == list(range(1, 11)) and drawn != list(range(1, 11))


def test_the_noiseless_sampler_shuffles_each_epoch_anew() -> None:
    sampler = ShuffledBatches(5, 2, torch.Generator().manual_seed(0))
    first = [sampler.next() for _ in range(3)]
    second = [sampler.next() for _ in range(3)]
    assert [len(b) for b in first] == [2, 2, 1]  # an epoch's last batch holds what is left
    assert sorted(x for b in first for x in b) == sorted(x for b in second for x in b) == list(range(5))
    assert first != second
    with pytest.raises(ValueError, match="no training examples"):
        ShuffledBatches(0, 2, torch.Generator())


@pytest.mark.parametrize("stop", [0, 1, 3, 4, 7])
def test_a_resumed_sampler_draws_the_batches_the_uninterrupted_one_would_have(stop: int) -> None:
    uninterrupted = ShuffledBatches(7, 3, torch.Generator().manual_seed(11))
    expected = [uninterrupted.next() for _ in range(12)]
    crashed = ShuffledBatches(7, 3, torch.Generator().manual_seed(11))
    for _ in range(stop):
        crashed.next()
    state = crashed.state_dict()
    resumed = ShuffledBatches(7, 3, torch.Generator().manual_seed(999))  # another seed: the state decides
    resumed.load_state_dict(state)
    assert [resumed.next() for _ in range(12 - stop)] == expected[stop:]


def _sequences(lengths: list[int]) -> list[torch.Tensor]:
    return [torch.full((n,), i + 1, dtype=torch.long) for i, n in enumerate(lengths)]


def _padded(groups: list[list[torch.Tensor]]) -> int:
    return sum(len(group) * max(len(e) for e in group) for group in groups)


@pytest.mark.parametrize("most", [None, 1, 3, 16])
def test_like_length_groups_hold_every_example_once_padded_by_at_most_the_share(most: int | None) -> None:
    lengths = np.random.default_rng(0).integers(2, 65, size=64).tolist()
    examples = _sequences(lengths)
    groups = like_length_groups(examples, most)
    flat = [e for group in groups for e in group]
    assert sorted(id(e) for e in flat) == sorted(id(e) for e in examples)  # each once, none copied
    assert [len(e) for e in flat] == sorted(lengths)  # shortest first
    for group in groups:
        assert most is None or len(group) <= most
        real = sum(len(e) for e in group)
        assert len(group) * max(len(e) for e in group) <= (1 + PADDING_SHARE) * real
    # the point of it: one padded batch of these computes far more than the groups
    assert _padded(groups) < 0.7 * _padded([examples])


def test_like_length_groups_of_classification_pairs_and_of_nothing() -> None:
    pairs = [(torch.ones(n, dtype=torch.long), n % 2) for n in (5, 30, 6, 31)]
    groups = like_length_groups(pairs)
    assert [[example_length(e) for e in g] for g in groups] == [[5, 6], [30, 31]]
    assert like_length_groups([]) == []


def test_equal_lengths_make_one_group_and_a_cap_splits_it() -> None:
    examples = _sequences([8] * 10)
    assert [len(g) for g in like_length_groups(examples)] == [10]
    assert [len(g) for g in like_length_groups(examples, most=4)] == [4, 4, 2]


class CountingLm(torch.nn.Module):
    """A tiny causal LM that counts the token positions it computes, padding included."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = torch.nn.Embedding(70, 8), torch.nn.Linear(8, 70)
        self.positions = 0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        self.positions += input_ids.numel()
        return SimpleNamespace(logits=self.head(self.embed(input_ids)))


def test_evaluation_reads_like_lengths_together_and_gives_each_sequence_its_own_figure() -> None:
    lengths = np.random.default_rng(1).integers(2, 60, size=40).tolist()
    sequences = _sequences(lengths)
    model = CountingLm()
    scores = sequence_nll(model, sequences, 0, torch.device("cpu"), batch_size=8)
    alone = torch.cat([sequence_nll(model, [s], 0, torch.device("cpu")) for s in sequences])
    torch.testing.assert_close(scores, alone, rtol=1e-6, atol=1e-4)  # input order kept, each as if read alone
    model.positions = 0
    mean_nll = float(scores[:, 0].sum() / scores[:, 1].sum())
    assert perplexity(model, sequences, 0, torch.device("cpu"), batch_size=8) == pytest.approx(math.exp(mean_nll))
    in_input_order = sum(8 * max(lengths[i:i + 8]) for i in range(0, 40, 8))
    assert model.positions < 0.7 * in_input_order  # like lengths together: far less padding computed
