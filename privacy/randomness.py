"""Where every random choice that touches private data comes from (PRIVACY.md, rule 5).

A run has one *root*: 32 bytes from the operating system (``secure``, the default for private
mechanisms), or derived from a seed (``seeded``, for tests and demos: anyone who knows the seed can
recompute the noise, so such a run's statement says its guarantee does not hold against them). The
root is never logged, returned or written to a checkpoint; a resumed secure run draws a new one.

Every stream is derived from the root by a keyed hash (BLAKE2b with the root as key) of a *path*:
its purpose, the round and, for per-unit choices, the unit's stable identifier. A stream is a numpy
``PCG64DXSM`` generator seeded with the full 256-bit digest (128 bits of state), never a torch CPU
generator: those keep only the low 32 bits of a seed, so anyone could try every seed and subtract
the noise. On a CUDA device the noise is drawn there, by torch's Philox generator keyed per chunk
with a 64-bit key and a 64-bit starting counter drawn from the round's stream
(:func:`privacy.primitives.device_noise_keys`). The secret is the key's 64 bits per chunk: once the key
is guessed, the counter can be read back (docs/PRIVACY.md, rule 1). So

* streams are independent per (round, unit): adding a user, an entity or a sentence changes no
  other unit's sampling coin, batch order or truncation priority (a shared sequential stream would
  reorder every later unit's draws, which the sensitivity analysis does not allow);
* nothing is stateful: a round's randomness is a function of (root, round), so a seeded run resumed
  from a checkpoint replays exactly, and no generator state needs saving;
* under torchrun, rank 0 draws the root and broadcasts it, so every rank samples the same units
  and adds the same noise (:meth:`Randomness.shared_across_ranks`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from uedp.privacy.statement import RandomnessMode as RandomnessMode  # named where configurations read it

ROOT_BYTES = 32
# What mechanisms draw from: a stream of this module, or (tests) a seeded torch generator.
RandomSource = np.random.Generator | torch.Generator


@dataclass(frozen=True)
class Randomness:
    """The secret root of a run's data-touching randomness; ``repr`` never shows it."""

    mode: RandomnessMode
    _root: bytes = field(repr=False)

    @classmethod
    def secure(cls) -> Randomness:
        """A fresh root from the operating system's randomness."""
        return cls("secure", os.urandom(ROOT_BYTES))

    @classmethod
    def seeded(cls, seed: int) -> Randomness:
        """A root anyone can recompute from ``seed``: reproducible, and no guarantee against them."""
        return cls("seeded", hashlib.blake2b(f"uedp-seeded-root:{int(seed)}".encode(), digest_size=ROOT_BYTES).digest())

    @classmethod
    def for_mode(cls, mode: RandomnessMode, seed: int) -> Randomness:
        if mode == "secure":
            return cls.secure()
        if mode == "seeded":
            return cls.seeded(seed)
        raise ValueError(f"unknown randomness mode {mode!r}; valid: secure, seeded")

    @property
    def caveats(self) -> tuple[str, ...]:
        """What a statement must say about this randomness: nothing when secure."""
        if self.mode == "seeded":
            return ("seeded randomness: sampling and noise follow from the configured seed, so the guarantee does "
                    "not hold against anyone who knows it (for tests and demos only)",)
        return ()

    def shared_across_ranks(self) -> Randomness:
        """Under ``torch.distributed``: rank 0's root, broadcast to every rank (identity in one process)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self
        backend = dist.get_backend()
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        buffer = torch.tensor(list(self._root), dtype=torch.uint8, device=device)
        dist.broadcast(buffer, src=0)
        return Randomness(self.mode, bytes(buffer.cpu().tolist()))

    # --- derivation -----------------------------------------------------------------------------------

    def _hasher(self, purpose: str, path: Sequence[object]) -> hashlib.blake2b:
        hasher = hashlib.blake2b(key=self._root, digest_size=8)
        hasher.update(_encode((purpose, *path)))
        return hasher

    def stream(self, purpose: str, *path: object) -> np.random.Generator:
        """The generator of one stream (e.g. ``"noise", round``); the same (root, purpose, path) always
        gives the same one. Seeded with a 256-bit keyed digest: not enumerable."""
        hasher = hashlib.blake2b(key=self._root, digest_size=32)
        hasher.update(_encode((purpose, *path)))
        entropy = int.from_bytes(hasher.digest(), "big")
        return np.random.Generator(np.random.PCG64DXSM(np.random.SeedSequence(entropy)))

    def uniforms(self, purpose: str, round_index: int, units: Iterable[object]) -> np.ndarray:
        """One uniform number in [0, 1) per unit, each a function of (root, purpose, round, unit) only."""
        prefix = self._hasher(purpose, (round_index,))
        out = []
        for unit in units:
            hasher = prefix.copy()
            hasher.update(_encode((unit,)))
            out.append(int.from_bytes(hasher.digest(), "big") >> 11)  # 53 bits: exact in a float64
        return np.asarray(out, dtype=np.float64) * (1.0 / (1 << 53))

    def poisson_sample(self, purpose: str, round_index: int, units: Sequence[object], q: float) -> list[int]:
        """Indices of ``units`` sampled independently with probability ``q``, each by its own coin."""
        if not 0 < q <= 1:
            raise ValueError(f"sampling probability must be in (0, 1], got {q}")
        if not len(units):
            return []
        return np.flatnonzero(self.uniforms(purpose, round_index, units) < q).tolist()

    def sampled_in(self, purpose: str, rounds: range, units: Sequence[object], q: float) -> np.ndarray:
        """Per round of ``rounds``: whether :meth:`poisson_sample` takes at least one of ``units`` (the
        same coins; a unit need not be in the data for its coin to exist)."""
        if not units:
            return np.zeros(len(rounds), dtype=bool)
        return np.array([bool((self.uniforms(purpose, r, units) < q).any()) for r in rounds], dtype=bool)

    def keep_at_most(self, purpose: str, round_index: int, units: Sequence[object], limit: int) -> list[int]:
        """Positions of a uniformly random ``limit`` of ``units`` (all when there are fewer), in order.

        Each unit's priority is its own keyed number, so which units survive never depends on how
        the others are numbered."""
        if len(units) <= limit:
            return list(range(len(units)))
        priority = self.uniforms(purpose, round_index, units)
        return sorted(np.argsort(priority, kind="stable")[:limit].tolist())


@dataclass(frozen=True)
class RoundRandomness:
    """The run's randomness seen from one round: every draw is keyed by the round, which the round
    loop (:mod:`privacy.mechanisms.loop`) fixes, so a round body that draws only through this view
    draws from its own round's streams (the loop hands no other view to it)."""

    source: Randomness
    round: int

    def stream(self, purpose: str, *path: object) -> np.random.Generator:
        return self.source.stream(purpose, self.round, *path)

    def poisson_sample(self, purpose: str, units: Sequence[object], q: float) -> list[int]:
        return self.source.poisson_sample(purpose, self.round, units, q)

    def keep_at_most(self, purpose: str, units: Sequence[object], limit: int) -> list[int]:
        return self.source.keep_at_most(purpose, self.round, units, limit)


def _encode(parts: Sequence[object]) -> bytes:
    """An unambiguous byte string for a path (length-prefixed parts, typed)."""
    out = bytearray()
    for part in parts:
        data = (f"i{part}" if isinstance(part, int) else f"s{part}").encode("utf-8")
        out += len(data).to_bytes(4, "big") + data
    return bytes(out)
