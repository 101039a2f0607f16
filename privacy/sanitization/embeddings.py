"""Token embeddings the sanitizers measure similarity with: a file of vectors (GloVe / word2vec text
format, or ``.npz``) or a model's input embedding matrix.

The vocabulary must be public: it is whatever the file or model holds (optionally its first
``limit`` entries, which are the most frequent ones in GloVe and word2vec files), never the words of
the private corpus, so the mapping built from it reveals nothing about the users' text.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from uedp.errors import UedpError

# A word, as the sanitizers segment text: a run of word characters (with inner apostrophes and
# hyphens), or one punctuation mark.
WORD = re.compile(r"\w+(?:['’-]\w+)*|[^\w\s]")


def words_of(text: str) -> list[str]:
    return WORD.findall(text)


@dataclass(frozen=True)
class Embeddings:
    tokens: list[str]
    vectors: np.ndarray  # (V, D) float32
    source: str = ""
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.vectors.ndim != 2 or self.vectors.shape[0] != len(self.tokens):
            raise UedpError(f"embeddings {self.source or ''}: {len(self.tokens)} tokens but vectors of shape "
                            f"{self.vectors.shape}")
        if len(set(self.tokens)) != len(self.tokens):
            raise UedpError(f"embeddings {self.source or ''}: a token appears twice")
        object.__setattr__(self, "index", {t: i for i, t in enumerate(self.tokens)})

    def __len__(self) -> int:
        return len(self.tokens)

    def key(self) -> str:
        """Content hash: names the cached nearest-neighbour tables built from these embeddings."""
        digest = hashlib.sha256()
        digest.update("\n".join(self.tokens).encode())
        digest.update(np.ascontiguousarray(self.vectors, dtype=np.float32).tobytes())
        return digest.hexdigest()

    def lookup(self, token: str) -> int | None:
        """The token's index; a word missing as written is tried in lower case (GloVe is lower-case)."""
        found = self.index.get(token)
        return found if found is not None else self.index.get(token.lower())


def load_vectors(path: Path, limit: int | None = None) -> Embeddings:
    """Read ``word v1 ... vD`` lines (an optional word2vec ``V D`` header line is skipped) or an
    ``.npz`` with arrays ``tokens`` and ``vectors``; a malformed line is an error naming FILE:LINE."""
    path = Path(path)
    if not path.is_file():
        raise UedpError(f"embeddings file {path} not found")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            tokens, vectors = [str(t) for t in data["tokens"]], data["vectors"].astype(np.float32)
        return Embeddings(tokens[:limit], vectors[:limit], str(path))
    tokens = []
    rows: list[np.ndarray] = []
    dim = None
    with open(path, encoding="utf-8", errors="strict") as handle:
        for number, line in enumerate(handle, start=1):
            parts = line.rstrip("\n").rstrip(" ").split(" ")
            if number == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                continue  # word2vec header
            if not line.strip():
                continue
            try:
                vector = np.asarray(parts[1:], dtype=np.float32)
            except ValueError:
                raise UedpError(f"{path}:{number}: expected a token followed by numbers") from None
            if dim is None:
                dim = vector.size
            if vector.size != dim or dim == 0:
                raise UedpError(f"{path}:{number}: {vector.size} numbers where earlier lines have {dim}")
            tokens.append(parts[0])
            rows.append(vector)
            if limit is not None and len(tokens) >= limit:
                break
    if not rows:
        raise UedpError(f"{path}: no vectors")
    return Embeddings(tokens, np.stack(rows), str(path))


def from_model(model: torch.nn.Module, tokenizer: object) -> Embeddings:
    """The model's input embedding matrix, one row per tokenizer token (special tokens excluded)."""
    weight = model.get_input_embeddings().weight.detach().float().cpu().numpy()  # type: ignore[operator]
    specials = set(getattr(tokenizer, "all_special_ids", []))
    ids = [i for i in range(min(len(tokenizer), weight.shape[0])) if i not in specials]  # type: ignore[arg-type]
    tokens = tokenizer.convert_ids_to_tokens(ids)  # type: ignore[attr-defined]
    return Embeddings(list(tokens), weight[ids], f"model input embeddings ({type(model).__name__})")


def word_vectors_from_text(texts: Iterable[str], dim: int = 64, window: int = 2, min_count: int = 1,
                           source: str = "") -> Embeddings:
    """Word vectors learnt offline from public text: the truncated SVD of the positive pointwise mutual
    information of lower-case words within ``window`` of each other (Levy and Goldberg's PPMI-SVD,
    context counts smoothed to the power 0.75), rows scaled to unit length.

    For machines that cannot download GloVe. The texts must be public (the vocabulary and the vectors
    are the mechanism's, and a release is local DP only if the mapping depends on no private text).
    """
    from scipy.sparse import coo_matrix
    from scipy.sparse.linalg import svds

    sentences = [[w.lower() for w in words_of(t)] for t in texts]
    counts = Counter(w for s in sentences for w in s)
    tokens = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    if len(tokens) <= dim + 1:
        raise UedpError(f"word vectors {source}: {len(tokens)} distinct words is too few for {dim} dimensions")
    index = {w: i for i, w in enumerate(tokens)}
    rows: list[int] = []
    cols: list[int] = []
    for sentence in sentences:
        ids = [index[w] for w in sentence if w in index]
        for i, a in enumerate(ids):
            for b in ids[max(0, i - window):i]:
                rows += [a, b]
                cols += [b, a]
    n = len(tokens)
    pairs = coo_matrix((np.ones(len(rows), dtype=np.float64), (rows, cols)), shape=(n, n)).tocsr()
    pairs.sum_duplicates()
    word_totals = np.asarray(pairs.sum(axis=1)).ravel()
    context = np.asarray(pairs.sum(axis=0)).ravel() ** 0.75
    ppmi = pairs.tocoo()
    # PMI with smoothed context probabilities: P(w, c) / (P(w) P_0.75(c)).
    values = np.log(ppmi.data * context.sum() / (word_totals[ppmi.row] * context[ppmi.col]))
    keep = values > 0
    matrix = coo_matrix((values[keep], (ppmi.row[keep], ppmi.col[keep])), shape=(n, n)).tocsr()
    u, singular, _ = svds(matrix, k=dim, random_state=0)
    vectors = (u * np.sqrt(singular)).astype(np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = vectors / np.where(norms > 0, norms, 1.0)
    return Embeddings(tokens, vectors, source or "word vectors from text")


def save_npz(embeddings: Embeddings, path: Path) -> Path:
    """Write ``tokens`` and ``vectors`` as an ``.npz`` that :func:`load_vectors` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp.npz")
    np.savez(partial, tokens=np.asarray(embeddings.tokens), vectors=embeddings.vectors)
    partial.replace(path)
    return path
