"""The exact path: each example's gradient from its own forward and backward pass, clipped and added.

It assumes nothing about the model's layers (no rule, no hook, no batch dimension inside the model): a
batch of one cannot mix examples, so each ``g_i`` is example i's gradient by construction. It is the
path for architectures ghost clipping has not been verified on; it costs one forward and one backward
pass per example, and the memory of one example's activations plus one gradient-sized buffer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import torch
from torch import nn

__all__ = ["ExactClipping"]

Loss = Any  # a callable (model, inputs) -> scalar tensor, as for ghost clipping


class ExactClipping:
    """Clipped per-example gradient sums of ``model``'s trainable parameters, one example at a time."""

    def __init__(self, model: nn.Module, loss_reduction: Literal["mean", "sum"] = "mean"):
        self.model = model
        # Unused: the loss of a batch of one is that example's loss under either reduction.
        self.loss_reduction = loss_reduction
        self.params = [p for p in model.parameters() if p.requires_grad]

    def close(self) -> None:
        """Nothing to remove: the model was never changed."""

    def clipped_sum(self, loss_fn: Loss, inputs: dict[str, torch.Tensor], batch_size: int,
                    clip: float) -> list[torch.Tensor]:
        """``sum_i min(1, clip / ||g_i||) g_i`` per trainable parameter; an example whose norm is not finite
        counts 0 (as on the other paths). Summed in at least float32, returned in each parameter's dtype."""
        sums = [torch.zeros_like(p, dtype=torch.promote_types(p.dtype, torch.float32)) for p in self.params]
        for grads in self._per_example(loss_fn, inputs, batch_size):
            norm = _norm(grads)
            if not torch.isfinite(norm):
                continue
            scale = torch.clamp(clip / (norm + 1e-12), max=1.0)
            for total, grad in zip(sums, grads):
                total.add_(grad.to(total.dtype) * scale.to(total.dtype))
        return [total.to(p.dtype) for total, p in zip(sums, self.params)]

    def per_example_norms(self, loss_fn: Loss, inputs: dict[str, torch.Tensor], batch_size: int) -> torch.Tensor:
        """``||g_i||`` over all trainable parameters, per example (float64)."""
        norms = [_norm(grads) for grads in self._per_example(loss_fn, inputs, batch_size)]
        return torch.stack(norms) if norms else torch.zeros(0, dtype=torch.float64)

    def _per_example(self, loss_fn: Loss, inputs: dict[str, torch.Tensor],
                     batch_size: int) -> Iterator[list[torch.Tensor]]:
        """Example i's gradient: ``loss_fn`` on row i of every input alone, differentiated by autograd."""
        for name, value in inputs.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != batch_size:
                raise ValueError(f"per-example gradients slice every input along dimension 0: {name!r} is not a "
                                 f"tensor with {batch_size} rows")
        for row in range(batch_size):
            example = _alone({name: value[row:row + 1] for name, value in inputs.items()})
            grads = torch.autograd.grad(loss_fn(self.model, example), self.params, allow_unused=True)
            yield [g.detach() if g is not None else torch.zeros_like(p) for g, p in zip(grads, self.params)]


def _alone(example: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One example as if collated alone: the batch's right padding beyond its own last token cut off, so
    its gradient cannot depend on how long the other examples of the batch are (a model that is not
    exactly invariant to padding would otherwise let one added example move another's gradient)."""
    mask = example.get("attention_mask")
    if mask is None or mask.dim() != 2:
        return example
    kept = mask[0].nonzero()
    width = int(kept[-1]) + 1 if len(kept) else mask.shape[1]
    return {name: value[:, :width] if value.dim() >= 2 and value.shape[1] == mask.shape[1] else value
            for name, value in example.items()}


def _norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The flat L2 norm over all parameters, in float64 (no float32 rounding understates it)."""
    if not grads:
        return torch.zeros((), dtype=torch.float64)
    squares = [torch.linalg.vector_norm(g, dtype=torch.float64).square() for g in grads]
    return torch.stack([s.to(squares[0].device) for s in squares]).sum().sqrt()
