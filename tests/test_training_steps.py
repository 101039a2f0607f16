"""One optimizer step (``models.training``), the device choice (``models.device``) and the shares of a batch
over processes (``models.parallel``), on their own.

Every non-private loop (noiseless training, pretraining, the public phase of selective, the measures of a
synthetic corpus) takes its steps here, and torchrun splits a batch by ``Ranks.mine``. The torchrun test
(tests/test_scale_out.py) compares whole runs; these pin the parts: the data-parallel step on one process
is the plain step, the shares cover a batch once, and Adam is torch's fused update where it can be.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from uedp.errors import UedpError
from uedp.models.batching import Example, collate, like_length_groups, padded_tokens
from uedp.models.device import autocast, resolve_device
from uedp.models.metrics import batch_weight, causal_lm_loss, per_sequence_lm_loss
from uedp.models.parallel import Ranks
from uedp.models.training import (
    SPLIT_SAVING,
    adam,
    data_parallel_step,
    like_length_step,
    optimizer_step,
    step_groups,
)

CPU = torch.device("cpu")


class TinyLm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(12, 6)
        self.head = torch.nn.Linear(6, 12)


def _loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over the batch's real tokens."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    logits = model.head(model.embed(ids[:, :-1]))
    targets = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 12), targets.reshape(-1), ignore_index=-100)


def _examples() -> list[Example]:
    return [torch.tensor(ids) for ids in ([1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 2], [3, 3])]


def _model() -> TinyLm:
    torch.manual_seed(0)
    return TinyLm()


def test_a_data_parallel_step_on_one_process_is_the_plain_step() -> None:
    plain, parallel = _model(), _model()
    plain_loss = optimizer_step(plain, adam(plain.parameters(), 0.05), collate(_examples(), 0), _loss, CPU)
    parallel_loss = data_parallel_step(parallel, adam(parallel.parameters(), 0.05), _examples(), 0, _loss, CPU, Ranks())
    assert parallel_loss == pytest.approx(plain_loss, rel=1e-6)
    for a, b in zip(plain.parameters(), parallel.parameters()):
        torch.testing.assert_close(a, b)


def test_a_step_moves_the_weights_and_lowers_the_loss_on_its_batch() -> None:
    model = _model()
    optimizer = adam(model.parameters(), 0.05)
    batch = collate(_examples(), 0)
    before = [p.detach().clone() for p in model.parameters()]
    losses = [optimizer_step(model, optimizer, batch, _loss, CPU) for _ in range(20)]
    assert losses[-1] < losses[0] and all(isinstance(loss, float) for loss in losses)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_shares_of_a_batch_cover_it_once_and_are_balanced_to_within_one() -> None:
    items = list(range(11))
    for world in (1, 2, 3, 4, 16):
        shares = [Ranks(rank, world).mine(items) for rank in range(world)]
        assert sorted(x for share in shares for x in share) == items
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert Ranks().is_main and not Ranks(1, 2).is_main
    assert Ranks.current() == Ranks()  # no process group in tests
    tensors = [torch.ones(2)]
    assert Ranks().sum_(tensors) is tensors and torch.equal(tensors[0], torch.ones(2))  # one process: nothing to add


def test_adam_is_fused_for_floating_weights_and_decoupled_on_request() -> None:
    weights = [torch.nn.Parameter(torch.zeros(3))]
    assert isinstance(adam(weights, 0.1), torch.optim.Adam) and adam(weights, 0.1).defaults["fused"] is True
    decoupled = adam(weights, 0.1, decoupled=True)
    assert isinstance(decoupled, torch.optim.AdamW) and decoupled.defaults["weight_decay"] == 0.0


def test_the_device_is_cpu_here_and_a_bad_or_missing_one_is_named() -> None:
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == CPU
    with pytest.raises(UedpError, match="invalid device 'tpu:9'; use auto, cpu, cuda or cuda:N"):
        resolve_device("tpu:9")
    if not torch.cuda.is_available():
        with pytest.raises(UedpError, match="'cuda:1' requested but CUDA is not available"):
            resolve_device("cuda:1")


def test_autocast_changes_nothing_on_the_cpu() -> None:
    layer = torch.nn.Linear(3, 3)
    with autocast(CPU):
        out = layer(torch.ones(1, 3))
    assert out.dtype == torch.float32


def _varied() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    return [torch.randint(1, 12, (n,), generator=generator) for n in (2, 9, 3, 14, 4, 15, 1, 8, 30, 5)]


class CausalTiny(TinyLm):
    """TinyLm as a Hugging Face causal LM is called (``logits`` of every position)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> SimpleNamespace:
        return SimpleNamespace(logits=self.head(self.embed(input_ids)))


@pytest.mark.parametrize("loss_fn", [causal_lm_loss, per_sequence_lm_loss])
def test_a_step_in_like_length_groups_is_the_one_padded_pass_step(loss_fn) -> None:  # type: ignore[no-untyped-def]
    """SGD, whose step is proportional to the gradient (Adam's first step would hide a wrong weighting)."""
    torch.manual_seed(0)
    grouped, plain = CausalTiny(), CausalTiny()
    plain.load_state_dict(grouped.state_dict())
    examples = _varied()
    groups = like_length_groups(examples)
    assert len(groups) > 2 and padded_tokens([examples]) >= SPLIT_SAVING * padded_tokens(groups)  # really split
    grouped_loss = like_length_step(grouped, torch.optim.SGD(grouped.parameters(), lr=0.5), examples, 0, loss_fn, CPU)
    plain_loss = optimizer_step(plain, torch.optim.SGD(plain.parameters(), lr=0.5), collate(examples, 0), loss_fn, CPU)
    assert grouped_loss == pytest.approx(plain_loss, rel=1e-5)
    for a, b in zip(grouped.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_wrong_weighting_would_be_caught() -> None:
    """The comparison above is not vacuous: weighting the parts equally moves the weights elsewhere."""
    torch.manual_seed(0)
    model = CausalTiny()
    examples = _varied()
    whole = torch.autograd.grad(causal_lm_loss(model, collate(examples, 0)), list(model.parameters()))
    groups = like_length_groups(examples)
    equal = [sum(g) / len(groups) for g in zip(*(torch.autograd.grad(causal_lm_loss(model, collate(group, 0)),
                                                                  list(model.parameters())) for group in groups))]
    assert any(not torch.allclose(a, b, rtol=1e-3) for a, b in zip(whole, equal))


def test_a_loss_without_a_known_weight_takes_one_padded_pass() -> None:
    def opaque(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return causal_lm_loss(model, batch)

    assert batch_weight(opaque) is None and batch_weight(causal_lm_loss) is not None
    torch.manual_seed(0)
    first, second = CausalTiny(), CausalTiny()
    second.load_state_dict(first.state_dict())
    examples = _varied()
    like_length_step(first, torch.optim.SGD(first.parameters(), lr=0.5), examples, 0, opaque, CPU)
    optimizer_step(second, torch.optim.SGD(second.parameters(), lr=0.5), collate(examples, 0), opaque, CPU)
    for a, b in zip(first.parameters(), second.parameters()):
        assert torch.equal(a, b)  # the same pass, bit for bit


def test_groups_that_would_save_little_padding_are_read_in_one_pass() -> None:
    """Two groups whose passes would compute more than 1/1.5 of one padded pass: the plain step, bit for bit."""
    torch.manual_seed(0)
    first, second = CausalTiny(), CausalTiny()
    second.load_state_dict(first.state_dict())
    examples = [torch.randint(1, 12, (n,)) for n in [10] * 6 + [14] * 6]
    groups = like_length_groups(examples)
    assert len(groups) == 2 and padded_tokens([examples]) < SPLIT_SAVING * padded_tokens(groups)
    assert step_groups(examples, causal_lm_loss) == [examples]
    like_length_step(first, torch.optim.SGD(first.parameters(), lr=0.5), examples, 0, causal_lm_loss, CPU)
    optimizer_step(second, torch.optim.SGD(second.parameters(), lr=0.5), collate(examples, 0), causal_lm_loss, CPU)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))


def test_a_batch_of_like_lengths_is_read_in_one_pass() -> None:
    """Little padding to save: one pass, bit for bit the plain step (a pass has a fixed cost of its own)."""
    torch.manual_seed(0)
    first, second = CausalTiny(), CausalTiny()
    second.load_state_dict(first.state_dict())
    examples = [torch.randint(1, 12, (n,)) for n in (10, 11, 12, 13, 14, 15, 16)]
    like_length_step(first, torch.optim.SGD(first.parameters(), lr=0.5), examples, 0, causal_lm_loss, CPU)
    optimizer_step(second, torch.optim.SGD(second.parameters(), lr=0.5), collate(examples, 0), causal_lm_loss, CPU)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
