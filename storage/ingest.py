"""Turn corpus files into the ``sentences`` and ``users`` tables, idempotently.

The content key of an ingest is the hash of the input bytes plus the ingest options; when the
existing tables carry the same key, nothing is rewritten and the caller is told the data was reused.
Both tables are written through :class:`storage.tables.TableWriter`, so a bad line anywhere in the
input leaves the previous tables (or none) in place.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from storage.formats.conll import read_conll
from storage.home import DataHome
from storage.schemas import SENTENCES, SPLITS, USERS
from storage.tables import TableWriter, hash_config, hash_files, is_current, read_manifest

# The CoNLL-2003 files carry their split in their names.
CONLL_FILE_SPLITS = {"eng.train": "train", "eng.testa": "valid", "eng.testb": "test"}
BATCH_ROWS = 10_000


@dataclass(frozen=True)
class SplitByUser:
    """Assign whole users to splits by a seeded hash, so no user straddles train and test."""

    seed: int = 0
    valid_fraction: float = 0.1
    test_fraction: float = 0.1

    def __call__(self, user_id: str) -> str:
        digest = hashlib.sha256(f"{self.seed}:{user_id}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        if u < self.test_fraction:
            return "test"
        if u < self.test_fraction + self.valid_fraction:
            return "valid"
        return "train"


@dataclass(frozen=True)
class IngestResult:
    dataset: str
    reused: bool
    sentences: int
    users: int
    key: str


def ingest_conll(home: DataHome, dataset: str, files: list[Path], split_by_user: SplitByUser | None = None) -> IngestResult:
    """Ingest CoNLL-2003 files; one document is one user (the UeDP paper's privacy unit).

    Splits come from the file names (``eng.train/testa/testb``) unless ``split_by_user`` is given,
    which is required for files whose names carry no split.
    """
    files = [Path(f) for f in files]
    if split_by_user is None and not all(f.name in CONLL_FILE_SPLITS for f in files):
        split_by_user = SplitByUser()
    options = {"format": "conll2003", "files": [f.name for f in files], "split_by_user": split_by_user}
    for f in files:  # fail on a missing file before hashing, with the reader's message
        if not f.is_file():
            next(read_conll(f))
    key = hash_config({"inputs": hash_files(files), "options": options})
    sentences_dir, users_dir = home.table_dir(dataset, "sentences"), home.table_dir(dataset, "users")
    if is_current(sentences_dir, key) and is_current(users_dir, key):
        manifest = read_manifest(users_dir) or {}
        return IngestResult(dataset, True, int((read_manifest(sentences_dir) or {})["rows"]), int(manifest["rows"]), key)

    counts: dict[str, Counter[str]] = defaultdict(Counter)
    details = {"source": options | {"split_by_user": repr(split_by_user)}}
    with TableWriter(sentences_dir, SENTENCES, key, details) as writer:
        rows: list[dict[str, object]] = []
        sentence_id = 0
        for path in files:
            for sent in read_conll(path):
                user_id = f"{path.name}#{sent.doc_index:05d}"
                split = split_by_user(user_id) if split_by_user else CONLL_FILE_SPLITS[path.name]
                counts[user_id][split] += 1
                rows.append(
                    {
                        "sentence_id": sentence_id,
                        "user_id": user_id,
                        "doc_id": user_id,
                        "split": split,
                        "position": sent.position,
                        "text": sent.text,
                        "source_file": path.name,
                        "source_line": sent.line,
                        "gold_spans": sent.spans(),
                    }
                )
                sentence_id += 1
                if len(rows) >= BATCH_ROWS:
                    writer.write_rows(rows)
                    rows = []
        writer.write_rows(rows)
        # Write users inside the sentences' context: a failure here discards both tables.
        with TableWriter(users_dir, USERS, key, details) as users_writer:
            users_writer.write_rows(
                [
                    {"user_id": user, "n_sentences": sum(c.values()), **{f"n_{s}": c[s] for s in SPLITS}}
                    for user, c in counts.items()
                ]
            )
    return IngestResult(dataset, False, writer.rows, len(counts), key)
