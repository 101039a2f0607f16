"""The shared machinery of every central mechanism (PRIVACY.md, steps 2-3): L2 clipping of a flattened
contribution, and Gaussian noise with standard deviation sigma. Sampling and the generators noise is
drawn from live in :mod:`privacy.randomness`."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from uedp.models.threads import available_cpus

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


def clip_factor(vector: torch.Tensor, bound: float) -> float:
    """``min(1, bound / ||vector||)``, the factor :func:`clip_l2` scales by; 0 when the norm is not finite.

    As a number, so a caller can scale while it adds (``total.add_(delta, alpha=weight * factor)``)
    instead of writing a clipped copy of a vector the size of the model."""
    if not bound > 0:  # NaN too
        raise ValueError(f"clipping bound must be positive, got {bound}")
    norm = float(torch.linalg.vector_norm(vector, dtype=torch.float64))  # a bf16 norm could understate it
    if not math.isfinite(norm):
        return 0.0
    return min(1.0, bound / (norm + 1e-12))


def clip_l2(vector: torch.Tensor, bound: float) -> torch.Tensor:
    """``c * min(1, bound / ||c||)``: the result's L2 norm is at most ``bound``.

    A non-finite contribution (a diverged local update) becomes zero: passing NaN on would make the
    whole noisy sum NaN, unbounded in sensitivity and revealing that such a unit took part.
    """
    factor = clip_factor(vector, bound)
    return torch.zeros_like(vector) if factor == 0.0 else vector * factor


def gaussian_noise(shape: torch.Size | tuple[int, ...], std: float, source: np.random.Generator | torch.Generator,
                   dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """N(0, std^2 I); ``std`` is the standard deviation, not the variance.

    ``source`` is a secret stream (:meth:`privacy.randomness.Randomness.stream`): drawn on the CPU, or on
    a CUDA ``device`` by keyed Philox (:func:`device_noise_keys`); or, in tests, a torch generator (drawn
    on its own device).
    """
    if std < 0:
        raise ValueError(f"noise standard deviation must be >= 0, got {std}")
    if isinstance(source, torch.Generator):
        return torch.randn(shape, generator=source, device=source.device, dtype=dtype) * std
    target = torch.device(device or "cpu")
    if target.type == "cuda":
        return _device_standard_normal(source, math.prod(shape), target).view(shape).mul_(std).to(dtype)
    draw = source.standard_normal(tuple(shape), dtype=np.float64 if dtype == torch.float64 else np.float32)
    return torch.from_numpy(draw).to(dtype).mul_(std).to(target)


def gaussian_noise_like(tensors: Sequence[torch.Tensor], std: float,
                        source: np.random.Generator | torch.Generator) -> list[torch.Tensor]:
    """N(0, std^2 I) shaped like each of ``tensors`` (their dtype and device), drawn as one flat vector.

    From a secret stream, a large CPU draw is split into fixed-size chunks, each filled by its own child
    stream (``Generator.spawn``: independent streams derived from this one's secret seed), on torch's
    intra-op threads. Deterministic for a seeded run: the chunks depend on the size only. Tensors on a
    CUDA device get noise drawn there (:func:`device_noise_keys`): nothing of the model's size is drawn
    on the CPU or copied."""
    return _noise_shaped([(t.shape, t.dtype, t.device) for t in tensors], std, source)


Spec = tuple[torch.Size, torch.dtype, torch.device]  # what a noise tensor must look like


def _noise_shaped(specs: Sequence[Spec], std: float, source: np.random.Generator | torch.Generator) -> list[torch.Tensor]:
    if std < 0:
        raise ValueError(f"noise standard deviation must be >= 0, got {std}")
    sizes = [math.prod(shape) for shape, _, _ in specs]
    total = sum(sizes)
    devices = {device for _, _, device in specs}
    if isinstance(source, torch.Generator):
        flat = torch.randn(total, generator=source, device=source.device).mul_(std)
    elif len(devices) == 1 and next(iter(devices)).type == "cuda":
        flat = _device_standard_normal(source, total, next(iter(devices))).mul_(std)
    else:  # scaled in place: a vector of the model's size is written once, not copied
        flat = torch.from_numpy(_parallel_standard_normal(source, total)).mul_(std)
    out, offset = [], 0
    for (shape, dtype, device), size in zip(specs, sizes):
        out.append(flat[offset:offset + size].view(shape).to(dtype=dtype, device=device))
        offset += size
    return out


def noise_ahead(tensors: Sequence[torch.Tensor], std: float,
                source: np.random.Generator | torch.Generator) -> Future[list[torch.Tensor]]:
    """:func:`gaussian_noise_like`, started before the caller computes what it is added to. The noise of a
    round depends on nothing the round computes (only on its own keyed stream, which no other code draws
    from), so drawing it first changes no value. Only shapes and dtypes are read from ``tensors`` (their
    values may change meanwhile).

    Where it runs: on a CUDA device, queued at once on the caller's thread (the device runs it in order
    with the round's work; the CPU does not wait for it). On the CPU, on a background thread only when
    some of this process' CPUs are not running torch's threads (:func:`overlaps_on_cpu`); otherwise now,
    before the round's work. Drawing beside torch's threads on cores they already fill preempts them, and
    every one of their operations then waits for its slowest thread: at 25M and 85M parameters a
    userdp round ran at 0.6-0.7x of the same round without noise that way, where the draw itself costs a
    few percent."""
    specs = [(t.shape, t.dtype, t.device) for t in tensors]
    on_device = not isinstance(source, torch.Generator) and any(device.type == "cuda" for _, _, device in specs)
    if on_device or not overlaps_on_cpu():
        done: Future[list[torch.Tensor]] = Future()
        done.set_result(_noise_shaped(specs, std, source))
        return done
    return _ahead_pool().submit(_noise_shaped, specs, std, source)


def overlaps_on_cpu() -> bool:
    """Whether a CPU noise draw can run beside torch's intra-op threads on cores they leave free."""
    return available_cpus() > torch.get_num_threads()


@functools.lru_cache(maxsize=1)
def _ahead_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(1, thread_name_prefix="uedp-noise-ahead")


# --- secret noise on a CUDA device ----------------------------------------------------------------------

# Values per device chunk: each chunk has its own key. Large enough that a 100M-parameter model needs a
# handful of kernel launches; small enough that no chunk's Philox counter range comes near another's.
DEVICE_NOISE_VALUES = 1 << 24


@dataclass(frozen=True)
class DeviceKey:
    """The key of one chunk of device noise: the 64-bit Philox key (``seed``) and a 64-bit starting
    counter (``offset``, a multiple of 4 as torch requires), never logged. The secret is the key's 64 bits:
    once the key is guessed, the counter can be read back from one block of output (docs/PRIVACY.md)."""

    seed: int
    offset: int

    def __repr__(self) -> str:  # never shown, as the run's root is not
        return "DeviceKey(<secret>)"


def device_noise_keys(source: np.random.Generator, count: int) -> list[DeviceKey]:
    """The keys of ``count`` values of device noise, one per chunk of :data:`DEVICE_NOISE_VALUES`, drawn
    from ``source``, the round's secret stream (seeded from the run's 256-bit root by a keyed hash of
    (purpose, round): PRIVACY.md, rule 1). Same stream, same keys: a seeded run replays on the device."""
    chunks = max(1, -(-count // DEVICE_NOISE_VALUES))
    words = source.integers(0, 1 << 64, size=(chunks, 2), dtype=np.uint64)
    return [DeviceKey(int(seed), int(offset) & ~3) for seed, offset in words.tolist()]


def _device_standard_normal(source: np.random.Generator, count: int, device: torch.device) -> torch.Tensor:
    """``count`` standard normals drawn on ``device`` by torch's Philox4x32-10 generator, chunk i keyed by
    :func:`device_noise_keys`: only the keys (16 bytes a chunk) come from the CPU.

    Drawn in float64, then rounded to float32: CUDA's float32 normals come from 32-bit uniforms by
    Box-Muller and never exceed about 6.8 sigma, a cut tail the Gaussian mechanism's accounting does not
    charge for; float64 draws (53-bit uniforms) reach about 8.6 sigma, past the CPU sampler's reach."""
    out = torch.empty(count, dtype=torch.float64, device=device)
    generator = torch.Generator(device=device)
    for index, key in enumerate(device_noise_keys(source, count)):
        generator.manual_seed(key.seed)
        generator.set_offset(key.offset)
        out[index * DEVICE_NOISE_VALUES:(index + 1) * DEVICE_NOISE_VALUES].normal_(generator=generator)
    return out.float()


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
