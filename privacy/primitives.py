"""The shared machinery of every central mechanism (PRIVACY.md, steps 2-3): L2 clipping of a flattened
contribution, and Gaussian noise with standard deviation sigma. Sampling and the generators noise is
drawn from live in :mod:`privacy.randomness`."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

# Below this many values one thread draws the noise; above, the draw is split over torch's threads
# (numpy releases the GIL while it fills an array): a secret stream draws about 100 M normals a second
# per core, so GPT-2 small's 124 M parameters took 1.5 s a step on one core.
PARALLEL_NOISE_VALUES = 1 << 18


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


def gaussian_noise_like(tensors: Sequence[torch.Tensor], std: float,
                        source: np.random.Generator | torch.Generator) -> list[torch.Tensor]:
    """N(0, std^2 I) shaped like each of ``tensors`` (their dtype and device), drawn as one flat vector.

    From a secret stream, a large draw is split into fixed-size chunks, each filled by its own child
    stream (``Generator.spawn``: independent streams derived from this one's secret seed), on torch's
    intra-op threads. Deterministic for a seeded run: the chunks depend on the size only."""
    return _noise_shaped([(t.shape, t.dtype, t.device) for t in tensors], std, source)


Spec = tuple[torch.Size, torch.dtype, torch.device]  # what a noise tensor must look like


def _noise_shaped(specs: Sequence[Spec], std: float, source: np.random.Generator | torch.Generator) -> list[torch.Tensor]:
    if std < 0:
        raise ValueError(f"noise standard deviation must be >= 0, got {std}")
    sizes = [math.prod(shape) for shape, _, _ in specs]
    total = sum(sizes)
    if isinstance(source, torch.Generator):
        flat = torch.randn(total, generator=source, device=source.device) * std
    else:
        flat = torch.from_numpy(_parallel_standard_normal(source, total)) * std
    out, offset = [], 0
    for (shape, dtype, device), size in zip(specs, sizes):
        out.append(flat[offset:offset + size].view(shape).to(dtype=dtype, device=device))
        offset += size
    return out


def noise_ahead(tensors: Sequence[torch.Tensor], std: float,
                source: np.random.Generator | torch.Generator) -> Future[list[torch.Tensor]]:
    """:func:`gaussian_noise_like`, drawn on a background thread while the caller computes what it is added
    to. The noise of a round depends on nothing the round computes (only on its own keyed stream, which no
    other code draws from), so drawing it first changes no value; its numpy fill releases the GIL and runs
    beside torch's kernels (on a GPU, beside the device's work). Only shapes and dtypes are read from
    ``tensors`` (their values may change meanwhile)."""
    specs = [(t.shape, t.dtype, t.device) for t in tensors]
    return _ahead_pool().submit(_noise_shaped, specs, std, source)


@functools.lru_cache(maxsize=1)
def _ahead_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix="uedp-noise-ahead")


def _parallel_standard_normal(source: np.random.Generator, count: int) -> np.ndarray:
    """``count`` standard normals; above one chunk, chunk i (of a fixed size) comes from child stream i,
    so the values do not depend on how many threads fill them (a seeded run resumed with other
    ``--threads`` replays)."""
    out = np.empty(count, dtype=np.float32)
    if count <= PARALLEL_NOISE_VALUES:
        source.standard_normal(out=out, dtype=np.float32)
        return out
    starts = range(0, count, PARALLEL_NOISE_VALUES)
    children = source.spawn(len(starts))

    def fill(i: int) -> None:
        start = starts[i]
        children[i].standard_normal(out=out[start:start + PARALLEL_NOISE_VALUES], dtype=np.float32)

    list(_noise_pool(max(1, torch.get_num_threads())).map(fill, range(len(starts))))
    return out


@functools.lru_cache(maxsize=1)  # one pool, resized if the thread count changes
def _noise_pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(workers, thread_name_prefix="uedp-noise")
