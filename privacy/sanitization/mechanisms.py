"""The samplers: CusText (exponential mechanism over a token's customized output set, scores
min-max normalised to [0, 1], ``Delta_u = 1``) and SanText (exponential mechanism over the whole
vocabulary with Euclidean distance, the baseline), drawn independently for every token occurrence.

What each epsilon means (PRIVACY.md, local DP):
- CusText: each released token is ``epsilon``-LDP with respect to replacing the input by any other
  token of the same input set (the tokens sharing its output set). Proof: scores lie in [0, 1], so
  ``Pr[y|x] / Pr[y|x'] <= e^{eps/2} * e^{eps/2}``.
- SanText: ``Pr[y|x] ~ exp(-eps d(x, y) / 2)`` is metric DP: the ratio is at most
  ``exp(eps * d(x, x'))``. As pure LDP over the whole vocabulary that is ``eps * diameter``, which
  :attr:`SanText.per_token_epsilon` reports (the headline figure, not the metric-DP ``eps``).
- A record composes over its releases (basic composition, exact for pure DP): one per sanitized
  position.

The thesis also describes ``record`` and ``dataset`` strategies, where repeats of a token share one
draw. They are withdrawn: for "x y x" the two outputs are always equal, for "x' y x" equal with
probability about 1/K, so the ratio between neighbouring records is unbounded and no per-token (or
per-record) epsilon holds; ``dataset`` also needs one trusted draw for all users, which is not local DP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from uedp.privacy.sanitization.choices import WITHDRAWN_STRATEGIES as WITHDRAWN_STRATEGIES
from uedp.privacy.sanitization.choices import Strategy as Strategy
from uedp.privacy.sanitization.choices import check_strategy as check_strategy
from uedp.privacy.sanitization.embeddings import Embeddings
from uedp.privacy.sanitization.mapping import Mapping, Metric, pairwise_distance

KEEP = -1  # a position that is not sanitized (a kept stopword or non-entity token)
UNKNOWN = -2  # a sanitized position whose token has no embedding: always released as the unknown marker


class Sampler(Protocol):
    name: str

    @property
    def per_token_epsilon(self) -> float: ...

    def distribution(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each input token: candidate outputs (n, C) and their probabilities (n, C)."""
        ...


@dataclass
class CusText:
    embeddings: Embeddings
    mapping: Mapping
    epsilon: float
    metric: Metric = "euclidean"
    name: str = "custext"

    def __post_init__(self) -> None:
        if not self.epsilon > 0:
            raise ValueError(f"epsilon must be positive, not {self.epsilon}")
        self._vectors = torch.from_numpy(np.ascontiguousarray(self.embeddings.vectors, dtype=np.float32))

    @property
    def per_token_epsilon(self) -> float:
        return self.epsilon

    def scores(self, tokens: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        """Output sets (n, K; -1 pads) and scores ``u = 1 - minmax(distance)`` in [0, 1] (-inf on pads)."""
        sets = self.mapping.output_sets[self.mapping.group_of[tokens]]
        valid = torch.from_numpy(sets >= 0)
        queries = self._vectors[torch.from_numpy(tokens)]
        members = self._vectors[torch.from_numpy(np.where(sets >= 0, sets, 0))]
        if self.metric == "cosine":
            distance = 1.0 - torch.nn.functional.cosine_similarity(queries[:, None, :], members, dim=-1)
        else:
            distance = torch.linalg.vector_norm(queries[:, None, :] - members, dim=-1)
        low = distance.masked_fill(~valid, float("inf")).min(dim=1, keepdim=True).values
        high = distance.masked_fill(~valid, float("-inf")).max(dim=1, keepdim=True).values
        span = (high - low).clamp_min(1e-12)
        score = torch.where(high > low, 1.0 - (distance - low) / span, torch.ones_like(distance))
        return sets, score.clamp(0.0, 1.0).masked_fill(~valid, float("-inf"))

    def distribution(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sets, score = self.scores(tokens)
        return sets, torch.softmax(self.epsilon * score / 2.0, dim=1).double().numpy()  # Delta_u = 1


@dataclass
class SanText:
    embeddings: Embeddings
    epsilon: float
    name: str = "santext"

    def __post_init__(self) -> None:
        if not self.epsilon > 0:
            raise ValueError(f"epsilon must be positive, not {self.epsilon}")
        self._vectors = torch.from_numpy(np.ascontiguousarray(self.embeddings.vectors, dtype=np.float32))
        self.diameter = _diameter(self._vectors)

    @property
    def per_token_epsilon(self) -> float:
        """Pure LDP over the whole vocabulary: ``eps * max_{x, x'} d(x, x')``."""
        return self.epsilon * self.diameter

    def distribution(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        distance = pairwise_distance(self._vectors[torch.from_numpy(tokens)], self._vectors, "euclidean")
        probs = torch.softmax(-self.epsilon * distance.double() / 2.0, dim=1).numpy()
        return np.broadcast_to(np.arange(len(self.embeddings)), probs.shape), probs


def _diameter(vectors: torch.Tensor, exact_up_to: int = 20_000, chunk: int = 2048) -> float:
    """Largest pairwise Euclidean distance; above ``exact_up_to`` tokens, the bound ``2 max ||v - mean||``."""
    if vectors.shape[0] > exact_up_to:
        return float(2 * torch.linalg.vector_norm(vectors - vectors.mean(0), dim=1).max())
    return float(max(torch.cdist(vectors[s:s + chunk], vectors).max() for s in range(0, vectors.shape[0], chunk)))


def sample(sampler: Sampler, tokens: np.ndarray, generator: torch.Generator | np.random.Generator, chunk: int = 1024) -> np.ndarray:
    """One independent draw per input token. Distributions are computed once per distinct token (text
    repeats tokens: Zipf), in chunks (SanText's rows span the vocabulary), and each occurrence draws by
    inverting that token's CDF at its own uniform number."""
    out = np.empty(len(tokens), dtype=np.int64)
    if not len(tokens):
        return out
    unique, inverse = np.unique(tokens, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=len(unique)))])
    uniforms = (torch.rand(len(tokens), generator=generator, dtype=torch.float64) if isinstance(generator, torch.Generator)
                else torch.from_numpy(generator.random(len(tokens))))
    for first in range(0, len(unique), chunk):
        candidates, probs = sampler.distribution(unique[first:first + chunk])
        cdf = torch.from_numpy(np.cumsum(probs, axis=1))
        cdf /= cdf[:, -1:].clone()  # exactly 1 at the last candidate (and on any zero-probability padding)
        candidates = np.asarray(candidates)
        for row in range(cdf.shape[0]):
            positions = order[bounds[first + row]:bounds[first + row + 1]]
            picks = torch.searchsorted(cdf[row], uniforms[positions], right=True).numpy()
            out[positions] = candidates[row][picks]
    return out


def privatize(records: list[np.ndarray], sampler: Sampler, generator: torch.Generator | np.random.Generator) -> list[np.ndarray]:
    """Sanitize every position >= 0 of every record (``KEEP`` and ``UNKNOWN`` pass through), with one
    independent draw per position."""
    lengths = [len(r) for r in records]
    flat = np.concatenate(records) if records else np.empty(0, dtype=np.int64)
    todo = np.flatnonzero(flat >= 0)
    result = flat.copy()
    if len(todo):
        result[todo] = sample(sampler, flat[todo], generator)
    return np.split(result, np.cumsum(lengths)[:-1]) if records else []


def releases_per_record(records: list[np.ndarray]) -> np.ndarray:
    """How many epsilon-LDP releases each record's guarantee composes over: its sanitized positions."""
    return np.asarray([int((record >= 0).sum()) for record in records], dtype=np.int64)
