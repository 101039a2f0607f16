"""What one local-DP release drew, kept beside it in the curator's data home.

A release is drawn once and then reused, never redrawn (two draws side by side would compose). The
figures about it (how many tokens it kept, how well an attacker recovers them) are computed against the
raw text, and their definitions and the attacker can change after the draw; keeping the draws lets them
be recomputed exactly on every reuse instead of being frozen at draw time. The draws are as private as
the raw text they index: they stay next to the release in the data home and are never pushed to a table
store, logged or released.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

DRAWS_FILE = "draws.npz"


@dataclass(frozen=True)
class Draws:
    """Per train sentence (``rows``: its row in the sentences table): each token's character span, the
    id that went into the mechanism (``KEEP`` / ``UNKNOWN`` markers included) and the id that came out."""

    rows: np.ndarray
    spans: list[list[tuple[int, int]]]
    records: list[np.ndarray]
    released: list[np.ndarray]

    def save(self, path: Path) -> None:
        lengths = np.array([len(r) for r in self.records], dtype=np.int64)
        flat_spans = np.array([span for spans in self.spans for span in spans], dtype=np.int64).reshape(-1, 2)
        empty = np.empty(0, dtype=np.int64)
        with open(path, "wb") as handle:
            np.savez_compressed(handle, rows=np.asarray(self.rows, dtype=np.int64), lengths=lengths, spans=flat_spans,
                                records=np.concatenate(self.records) if self.records else empty,
                                released=np.concatenate(self.released) if self.released else empty)

    @classmethod
    def load(cls, path: Path) -> Draws | None:
        """The draws kept in ``path``, or None where there are none (a release pulled from a table
        store, or drawn by a uedp that did not keep them)."""
        if not path.is_file():
            return None
        with np.load(path, allow_pickle=False) as data:
            rows, lengths = data["rows"], data["lengths"]
            total = int(lengths.sum())
            if len(lengths) != len(rows) or not total == len(data["spans"]) == len(data["records"]) == len(data["released"]):
                raise ValueError(f"{path}: the draws do not add up (a file of another release, or damaged)")
            if len(rows) == 0:  # np.split of an empty array gives one empty part, not none
                return cls(rows, [], [], [])
            bounds = np.cumsum(lengths)[:-1]
            spans = [[(int(s), int(e)) for s, e in part] for part in np.split(data["spans"], bounds)]
            return cls(rows, spans, np.split(data["records"], bounds), np.split(data["released"], bounds))
