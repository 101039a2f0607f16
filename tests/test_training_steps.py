"""One optimizer step (``models.training``), the device choice (``models.device``) and the shares of a batch
over processes (``models.parallel``), on their own.

Every non-private loop (noiseless training, pretraining, the public phase of selective, the measures of a
synthetic corpus) takes its steps here, and torchrun splits a batch by ``Ranks.mine``. The torchrun test
(tests/test_scale_out.py) compares whole runs; these pin the parts: the data-parallel step on one process
is the plain step, the shares cover a batch once, and Adam is torch's fused update where it can be.
"""

from __future__ import annotations

import pytest
import torch

from uedp.errors import UedpError
from uedp.models.batching import Example, collate
from uedp.models.device import autocast, resolve_device
from uedp.models.parallel import Ranks
from uedp.models.training import adam, data_parallel_step, optimizer_step

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
