"""Data parallelism across the processes ``torchrun`` starts (one per GPU), for training loops that
sum per-user or per-example contributions.

Every process holds the same model and draws the same random numbers (every stream derives from one
secret root that rank 0 draws and broadcasts, ``privacy.randomness``), so all agree on who is sampled,
on each user's batch order and on the noise. Each process computes its share
of the round's users or examples (``mine``), one all-reduce adds the shares, and every process
applies the same update. The sum, and so the privacy analysis, is the same as in one process; only
the float summation order differs. Without ``torch.distributed`` initialised this is one process
and every method is the identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1

    @classmethod
    def current(cls) -> Ranks:
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def is_main(self) -> bool:
        """The process that logs, evaluates and writes checkpoints."""
        return self.rank == 0

    def mine(self, items: Sequence[T]) -> list[T]:
        """This process' share: every ``world``-th item from position ``rank`` (balanced to within one)."""
        return list(items[self.rank::self.world])

    def sum_(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Add each tensor over all processes, in place, with one collective; returns the list."""
        if self.world == 1 or not tensors:
            return tensors
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for tensor in tensors:
            tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()
        return tensors

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()
