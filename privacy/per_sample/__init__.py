"""Clipped sums of per-example gradients, the step DP-SGD's sensitivity rests on: ghost clipping
(:mod:`.ghost`, the default: per-layer norms from activations, exact per-layer fallback by torch.func)
or Opacus' materialised per-sample gradients (:mod:`.opacus_path`)."""

from __future__ import annotations

from typing import Any, Literal, Protocol

import torch
from torch import nn

__all__ = ["Engine", "PerSampleClipping", "per_sample_clipping"]

Engine = Literal["ghost", "opacus"]


class PerSampleClipping(Protocol):
    """``clipped_sum`` returns ``sum_i min(1, clip / ||g_i||) g_i`` per trainable parameter."""

    def clipped_sum(self, loss_fn: Any, inputs: dict[str, torch.Tensor], batch_size: int,
                    clip: float) -> list[torch.Tensor]: ...

    def close(self) -> None: ...


def per_sample_clipping(model: nn.Module, engine: Engine = "ghost",
                        loss_reduction: Literal["mean", "sum"] = "mean") -> PerSampleClipping:
    if engine == "ghost":
        from uedp.privacy.per_sample.ghost import GhostClipping

        return GhostClipping(model, loss_reduction)
    if engine == "opacus":
        from uedp.privacy.per_sample.opacus_path import OpacusClipping

        return OpacusClipping(model, loss_reduction)
    raise ValueError(f"unknown per-example gradient engine {engine!r}; valid: ghost, opacus")
