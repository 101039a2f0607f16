"""CusText's mapping function (thesis Algorithm 1): each input token's customized output set of K
tokens, built from a K-nearest-neighbour table computed once, vectorized, and cached by content.

Interpretation of Algorithm 1 (its pseudocode resets the temporary input set ``T`` every iteration and
so never skips anything, while its "marry" example does skip tokens already assigned). uedp follows the
example, which is also what makes the balanced mapping balanced:

- tokens are visited in vocabulary order (frequency order for GloVe/word2vec files: public);
- ``aggressive``: every token's output set is its own K nearest tokens (mostly 1-N: no adjacent input);
- ``balanced``: a token not yet assigned takes its K nearest tokens ``L`` (itself first, at distance 0)
  and every token of ``L`` that is not yet assigned gets ``L`` as its output set (N-M groups that may
  overlap);
- ``conservative``: as balanced, but ``L`` is drawn from tokens not yet placed in any output set, so
  the sets partition the vocabulary (every token N-M; the last group may hold fewer than K).

Privacy: the exponential mechanism makes two inputs ``x, x'`` with the *same* output set
epsilon-indistinguishable. Tokens whose output set no other token shares (1-N) have no adjacent token
and no guarantee beyond hiding among the outputs; :attr:`Mapping.unprotected_share` reports them.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from uedp.privacy.sanitization.choices import MappingMode as MappingMode
from uedp.privacy.sanitization.choices import Metric as Metric
from uedp.privacy.sanitization.embeddings import Embeddings


def pairwise_distance(queries: torch.Tensor, keys: torch.Tensor, metric: Metric) -> torch.Tensor:
    """Distances (smaller = closer): Euclidean, or 1 - cosine similarity."""
    if metric == "cosine":
        q = torch.nn.functional.normalize(queries, dim=-1)
        k = torch.nn.functional.normalize(keys, dim=-1)
        return 1.0 - q @ k.T
    return torch.cdist(queries, keys)


def nearest(vectors: np.ndarray, k: int, metric: Metric, chunk: int = 2048) -> np.ndarray:
    """Indices of each token's ``k`` nearest tokens (itself included), closest first: chunked top-k of
    a distance matrix, never a Python loop over pairs. Within the k, equal distances are ordered by index."""
    data = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))
    k = min(k, data.shape[0])
    out = np.empty((data.shape[0], k), dtype=np.int64)
    for start in range(0, data.shape[0], chunk):
        distances = pairwise_distance(data[start:start + chunk], data, metric)
        rows = torch.arange(distances.shape[0])
        distances[rows, rows + start] = -1.0  # a token is its own nearest, whatever rounding says
        values, indices = torch.topk(distances, k, dim=1, largest=False)
        # topk's order among equal values is unspecified: sort by index, then stably by distance.
        by_index = torch.argsort(indices, dim=1)
        values, indices = values.gather(1, by_index), indices.gather(1, by_index)
        order = torch.argsort(values, dim=1, stable=True)
        out[start:start + chunk] = indices.gather(1, order).numpy()
    return out


@dataclass(frozen=True)
class Mapping:
    """``output_sets[group_of[x]]`` is token ``x``'s output set (token indices, padded with -1)."""

    output_sets: np.ndarray  # (G, K) int64
    group_of: np.ndarray  # (V,) int64
    mode: MappingMode
    k: int

    def output_set(self, token: int) -> np.ndarray:
        row = self.output_sets[self.group_of[token]]
        members: np.ndarray = row[row >= 0]
        return members

    @property
    def input_set_sizes(self) -> np.ndarray:
        """For each token, how many tokens share its output set (its input set's size)."""
        counts = np.bincount(self.group_of, minlength=len(self.output_sets))
        sizes: np.ndarray = counts[self.group_of]
        return sizes

    @property
    def unprotected_share(self) -> float:
        """Share of tokens of type 1-N: no other token maps to their output set (thesis Table 3.4)."""
        return float(np.mean(self.input_set_sizes == 1))


def build_mapping(embeddings: Embeddings, k: int, mode: MappingMode = "balanced", metric: Metric = "euclidean",
                  cache_dir: Path | None = None) -> Mapping:
    """The mapping for these embeddings, from the cache when it was built before."""
    if k < 1:
        raise ValueError(f"K must be at least 1, not {k}")
    key = hashlib.sha256(f"{embeddings.key()}:{k}:{mode}:{metric}".encode()).hexdigest()[:24]
    cached = cache_dir / f"custext-mapping-{key}.npz" if cache_dir else None
    if cached is not None and cached.is_file():
        with np.load(cached) as saved:
            return Mapping(saved["output_sets"], saved["group_of"], mode, k)
    mapping = _build(embeddings.vectors, k, mode, metric)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cached.parent, suffix=".npz", delete=False) as tmp:
            np.savez(tmp, output_sets=mapping.output_sets, group_of=mapping.group_of)
        os.replace(tmp.name, cached)
    return mapping


def _build(vectors: np.ndarray, k: int, mode: MappingMode, metric: Metric) -> Mapping:
    n = vectors.shape[0]
    k = min(k, n)
    if mode == "conservative":
        return _conservative(vectors, k, metric)
    table = nearest(vectors, k, metric)
    if mode == "aggressive":
        return Mapping(table, np.arange(n), mode, k)
    group_of = np.full(n, -1, dtype=np.int64)
    sets: list[np.ndarray] = []
    for token in range(n):  # sequential by nature (a token's set depends on earlier ones); O(V K)
        if group_of[token] >= 0:
            continue
        candidates = table[token]
        unassigned = candidates[group_of[candidates] < 0]
        group_of[unassigned] = len(sets)
        sets.append(candidates)
    return Mapping(np.stack(sets), group_of, mode, k)


def _conservative(vectors: np.ndarray, k: int, metric: Metric) -> Mapping:
    data = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32))
    n = data.shape[0]
    group_of = np.full(n, -1, dtype=np.int64)
    sets: list[np.ndarray] = []
    remaining = torch.ones(n, dtype=torch.bool)
    for token in range(n):
        if group_of[token] >= 0:
            continue
        distances = pairwise_distance(data[token:token + 1], data, metric)[0]
        distances[token] = -1.0
        distances[~remaining] = float("inf")
        take = min(k, int(remaining.sum()))
        chosen = torch.argsort(distances, stable=True)[:take].numpy()
        group_of[chosen] = len(sets)
        remaining[chosen] = False
        sets.append(np.pad(chosen, (0, k - take), constant_values=-1))
    return Mapping(np.stack(sets), group_of, "conservative", k)
