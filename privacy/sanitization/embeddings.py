"""Token embeddings the sanitizers measure similarity with: a file of vectors (GloVe / word2vec text
format, or ``.npz``) or a model's input embedding matrix.

The vocabulary must be public: it is whatever the file or model holds (optionally its first
``limit`` entries, which are the most frequent ones in GloVe and word2vec files), never the words of
the private corpus, so the mapping built from it reveals nothing about the users' text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from uedp.errors import UedpError


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
