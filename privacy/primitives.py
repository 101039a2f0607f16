"""The shared machinery of every central mechanism (PRIVACY.md, steps 2-3): L2 clipping of a flattened
contribution, and Gaussian noise with standard deviation sigma. Sampling and the generators noise is
drawn from live in :mod:`privacy.randomness`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def flatten(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """A new flat vector holding the parameters' current values (the space clipping works in)."""
    return torch.cat([p.detach().reshape(-1) for p in params])


@torch.no_grad()
def assign_flat_(params: Sequence[torch.Tensor], vector: torch.Tensor) -> None:
    """Copy ``vector`` into the parameters' own storage.

    Not ``torch.nn.utils.vector_to_parameters``: that makes each parameter a *view* of ``vector``, so
    later in-place optimizer steps would silently rewrite ``vector`` (here: the global weights every
    user's delta is measured from).
    """
    offset = 0
    for p in params:
        p.copy_(vector[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    if offset != vector.numel():
        raise ValueError(f"vector has {vector.numel()} values, parameters need {offset}")


def clip_l2(vector: torch.Tensor, bound: float) -> torch.Tensor:
    """``c * min(1, bound / ||c||)``: the result's L2 norm is at most ``bound``.

    A non-finite contribution (a diverged local update) becomes zero: passing NaN on would make the
    whole noisy sum NaN, unbounded in sensitivity and revealing that such a unit took part.
    """
    if bound <= 0:
        raise ValueError(f"clipping bound must be positive, got {bound}")
    norm = torch.linalg.vector_norm(vector)
    if not torch.isfinite(norm):
        return torch.zeros_like(vector)
    scale = torch.clamp(bound / (norm + 1e-12), max=1.0)
    return vector * scale


def gaussian_noise(shape: torch.Size | tuple[int, ...], std: float, source: np.random.Generator | torch.Generator,
                   dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """N(0, std^2 I); ``std`` is the standard deviation, not the variance.

    ``source`` is a secret stream (:meth:`privacy.randomness.Randomness.stream`, drawn on the CPU and
    moved to ``device``) or, in tests, a torch generator (drawn on its own device).
    """
    if std < 0:
        raise ValueError(f"noise standard deviation must be >= 0, got {std}")
    if isinstance(source, torch.Generator):
        return torch.randn(shape, generator=source, device=source.device, dtype=dtype) * std
    draw = source.standard_normal(tuple(shape), dtype=np.float64 if dtype == torch.float64 else np.float32)
    return (torch.from_numpy(draw).to(dtype) * std).to(device or "cpu")
