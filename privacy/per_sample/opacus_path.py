"""The exact, slow path: Opacus' ``GradSampleModule`` materialises every example's gradient of every
parameter (``grad_sample``), which are then clipped and summed. Kept for models whose layers the
ghost path cannot split per example, for the recurrent Selective-DPSGD (which switches Opacus' hooks
on and off within a step), and as the reference the ghost path is tested against."""

from __future__ import annotations

import warnings
from typing import Any, Literal, cast

import torch
from torch import nn

__all__ = ["OpacusClipping", "sum_clipped_grad_samples"]


class OpacusClipping:
    """Clipped per-example gradient sums from Opacus' per-sample gradients; ``module`` is the wrapped model."""

    def __init__(self, model: nn.Module, loss_reduction: Literal["mean", "sum"] = "mean"):
        from opacus import GradSampleModule  # imported when a run trains, not when the registry is read

        with warnings.catch_warnings():  # Opacus warns about modules it does not validate strictly
            warnings.simplefilter("ignore")
            self.module = GradSampleModule(model, strict=False, loss_reduction=loss_reduction)
        self.params = [p for p in self.module.parameters() if p.requires_grad]

    def clipped_sum(self, loss_fn: Any, inputs: dict[str, torch.Tensor], batch_size: int,
                    clip: float) -> list[torch.Tensor]:
        loss = loss_fn(self.module, inputs)
        with warnings.catch_warnings():  # PyTorch notes that Opacus' hooks fire on outputs only: expected
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss.backward()
        # loss_reduction="mean": Opacus scales per-sample gradients back to per-example losses.
        return sum_clipped_grad_samples(self.params, batch_size, clip)

    def close(self) -> None:
        self.module.remove_hooks()  # the caller gets its plain model back


def sum_clipped_grad_samples(params: list[torch.Tensor], batch_size: int, clip: float) -> list[torch.Tensor]:
    """``sum_i clip(g_i, clip)`` per parameter from Opacus' ``grad_sample`` (flat clipping over all
    parameters; a non-finite example counts 0); clears ``grad_sample`` and ``grad`` afterwards.

    Under bf16 autocast Opacus' hooks give bf16 per-sample gradients: they are taken in float32 at least, the
    norms in float64 and the scaled sum in float32, so that each example's contribution to the sum is at most
    ``clip`` in the precision the noise is added in (in bf16 the scale and the sum rounded past it)."""
    # grad_sample is the attribute Opacus' hooks attach to each parameter at run time.
    samples = [_at_least_float32(param.grad_sample) if param.grad_sample is not None  # type: ignore[attr-defined]
               else torch.zeros((batch_size, *param.shape), device=param.device) for param in params]
    # builtins.sum is typed ``Tensor | Literal[0]`` (its start 0, for an empty input): over parameters it is a Tensor.
    norms = torch.sqrt(cast(torch.Tensor, sum(g.reshape(batch_size, -1).double().pow(2).sum(1) for g in samples)))
    scale = torch.clamp(clip / (norms + 1e-12), max=1.0)
    scale = torch.where(torch.isfinite(norms), scale, torch.zeros_like(scale))
    summed = [torch.einsum("b,b...->...", scale.to(g.dtype), torch.nan_to_num(g)) for g in samples]
    for param in params:
        param.grad_sample = None  # type: ignore[attr-defined]
        param.grad = None
    return summed


def _at_least_float32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor
