"""Turn corpus files of any supported format into the ``sentences`` and ``users`` tables, idempotently.

"User" is the privacy unit, so how records become users is explicit (``IngestOptions.users``) and
recorded in the manifest. The content key of an ingest is the hash of the input bytes plus the
options; when the existing tables carry the same key nothing is rewritten and the caller is told the
data was reused. Both tables go through :class:`storage.tables.TableWriter`: a bad line anywhere in
the input leaves the previous tables (or none) in place. Readers stream, so memory stays bounded by
one batch of rows plus one counter per user.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from uedp.errors import UedpError
from uedp.progress import progress as progress_bar
from uedp.storage.formats import FormatError, SourceRecord, split_from_filename
from uedp.storage.formats.agnews import agnews_csv_records, agnews_jsonl_records
from uedp.storage.formats.conll import conll_records
from uedp.storage.formats.sec import edgar_corpus_records, edgar_submission_records
from uedp.storage.formats.tabular import csv_records, jsonl_records
from uedp.storage.formats.wikitext import wikitext_records
from uedp.storage.home import DataHome
from uedp.storage.schemas import SCHEMA_VERSION, SENTENCES, SPLITS, USERS
from uedp.storage.tables import TableWriter, hash_config, hash_files, is_current, read_manifest

FORMATS: tuple[str, ...] = ("conll2003", "ag_news", "sec", "wikitext", "jsonl", "csv")
# Formats whose files carry entity annotation (what the ``gold`` detector reads).
GOLD_FORMATS: frozenset[str] = frozenset({"conll2003"})
SplitMode = Literal["auto", "files", "users"]
BATCH_ROWS = 10_000

# The user strategy each format uses when none is given: the one its paper uses where there is one.
DEFAULT_USERS = {"conll2003": "document", "sec": "filer", "wikitext": "article", "ag_news": "source",
                 "jsonl": "column", "csv": "column"}


@dataclass(frozen=True)
class SplitByUser:
    """Assign whole users to splits by a seeded hash, so no user straddles train and test."""

    seed: int = 0
    valid_fraction: float = 0.1
    test_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not (0 <= self.valid_fraction < 1 and 0 <= self.test_fraction < 1
                and self.valid_fraction + self.test_fraction < 1):
            raise UedpError("valid and test fractions must be in [0, 1) and sum to less than 1")

    def __call__(self, user_id: str) -> str:
        digest = hashlib.sha256(f"{self.seed}:{user_id}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        if u < self.test_fraction:
            return "test"
        if u < self.test_fraction + self.valid_fraction:
            return "valid"
        return "train"


@dataclass(frozen=True)
class IngestOptions:
    """How to read the files and who the users are. Every field is part of the content key."""

    format: str
    users: str | None = None  # document|filer|article (fixed by format), source, chunk:N, column
    text_col: str | None = None
    user_col: str | None = None
    label_col: str | None = None
    split_col: str | None = None
    split: SplitMode = "auto"
    split_by_user: SplitByUser = field(default_factory=SplitByUser)
    detokenize: bool = False
    sec_document_types: tuple[str, ...] = ()
    # (file name, split): which split a whole file is, where its name does not say (or says wrongly).
    split_of: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for file_name, role in self.split_of:
            if role not in SPLITS:
                raise UedpError(f"--split-of {file_name}={role}: the split must be one of {', '.join(SPLITS)}")
        named = [file_name for file_name, _ in self.split_of]
        if len(set(named)) != len(named):
            raise UedpError("--split-of names a file twice")
        if self.format not in FORMATS:
            raise UedpError(f"unknown format {self.format!r}; valid: {', '.join(FORMATS)}")
        if self.split not in ("auto", "files", "users"):
            raise UedpError(f"unknown split mode {self.split!r}; valid: auto, files, users")
        strategy = self.user_strategy
        fixed = {"conll2003": "document", "sec": "filer", "wikitext": "article"}
        if self.format in fixed and strategy != fixed[self.format]:
            raise UedpError(f"format {self.format} has fixed users ({fixed[self.format]}); drop --users")
        if self.format == "ag_news" and not (strategy == "source" or strategy.startswith("chunk:")):
            raise UedpError("ag_news users: 'source' (news agency) or 'chunk:N' (pseudo-users of N records)")
        if self.format in ("jsonl", "csv"):
            if not self.text_col:
                raise UedpError(f"format {self.format} needs --text-col")
            if strategy == "column" and not self.user_col:
                raise UedpError(f"format {self.format} needs --user-col, or --users chunk:N")
        if strategy.startswith("chunk:"):
            size = strategy.removeprefix("chunk:")
            if not size.isdigit() or int(size) < 1:
                raise UedpError(f"invalid user strategy {strategy!r}: chunk size must be a positive integer")

    @property
    def user_strategy(self) -> str:
        return self.users or DEFAULT_USERS[self.format]

    def describe(self) -> dict[str, object]:
        return asdict(self) | {"users": self.user_strategy}

    def role_of(self, path: Path) -> str | None:
        """The split a whole file is: given with ``split_of`` (by name), else read from its name."""
        return dict(self.split_of).get(path.name) or split_from_filename(path)


def file_roles(files: list[Path], options: IngestOptions) -> list[str | None]:
    """Each input's split as the file level sees it; part of the content key, so renaming
    ``a.txt`` to ``train.txt`` (or a new ``--split-of``) is a different ingest, not a reuse."""
    given = {file_name for file_name, _ in options.split_of}
    unknown = sorted(given - {path.name for path in files})
    if unknown:
        raise UedpError(f"--split-of names {', '.join(unknown)}, which is not among the input files "
                        f"({', '.join(path.name for path in files)})")
    return [options.role_of(path) for path in files]


@dataclass(frozen=True)
class IngestResult:
    dataset: str
    reused: bool
    sentences: int
    users: int
    key: str
    per_split: dict[str, int] = field(default_factory=dict)

    @property
    def warning(self) -> str | None:
        """What will fail later, said now: a dataset without a train split cannot be trained on."""
        if self.per_split.get("train"):
            return None
        return (f"dataset {self.dataset!r} has no train split ({', '.join(f'{s} {n}' for s, n in self.per_split.items() if n) or 'no sentences'}): "
                "`uedp train` will refuse it; say which file is which with --split-of FILE=train, or --split users")


def records_for(path: Path, options: IngestOptions) -> Iterator[SourceRecord]:
    """The reader for a file, chosen by format and, where a format has two forms, by file name."""
    name = path.name.lower()
    json_like = ".jsonl" in name or ".json" in name
    if options.format == "conll2003":
        return conll_records(path)
    if options.format == "ag_news":
        return agnews_jsonl_records(path) if json_like else agnews_csv_records(path)
    if options.format == "sec":
        return edgar_corpus_records(path) if json_like else edgar_submission_records(path, options.sec_document_types)
    if options.format == "wikitext":
        return wikitext_records(path, options.detokenize)
    reader = jsonl_records if options.format == "jsonl" else csv_records
    return reader(path, options.text_col or "", options.user_col, options.label_col, options.split_col)


def _user_assigner(path: Path, options: IngestOptions) -> Callable[[int, SourceRecord], str]:
    strategy = options.user_strategy
    if strategy.startswith("chunk:"):
        size = int(strategy.removeprefix("chunk:"))
        return lambda index, record: f"{path.name}#chunk{index // size:07d}"
    if strategy == "source":
        return lambda index, record: f"source:{record.source_user_hint or 'unknown'}"

    def from_record(index: int, record: SourceRecord) -> str:
        if record.user is None:
            raise FormatError(path, record.line, f"record has no user for strategy {strategy!r}")
        return record.user

    return from_record


def _split_of(path: Path, record: SourceRecord, user: str, options: IngestOptions) -> str:
    if path.name in dict(options.split_of):  # the user's word for the whole file beats its name and columns
        return dict(options.split_of)[path.name]
    if options.split == "users" or (options.split == "auto" and record.split is None):
        return options.split_by_user(user)
    if record.split is None:
        raise FormatError(path, record.line, "--split files, but neither the file name nor a split column gives a split")
    return record.split


def ingest(home: DataHome, dataset: str, files: list[Path], options: IngestOptions,
           progress: bool = False) -> IngestResult:
    """Ingest ``files`` as ``dataset``; reuse the existing tables when inputs and options are unchanged."""
    files = [Path(f) for f in files]
    if not files:
        raise UedpError("no input files given")
    for path in files:  # fail on a missing file before hashing, with the reader's message
        if not path.is_file():
            raise FormatError(path, None, "file not found" if not path.exists() else "not a regular file")
    key = hash_config({"inputs": hash_files(files), "roles": file_roles(files, options), "options": options.describe(),
                       "schema": SCHEMA_VERSION})
    sentences_dir, users_dir = home.table_dir(dataset, "sentences"), home.table_dir(dataset, "users")
    if is_current(sentences_dir, key) and is_current(users_dir, key):
        manifest = read_manifest(sentences_dir) or {}
        return IngestResult(dataset, True, int(manifest["rows"]), int((read_manifest(users_dir) or {})["rows"]), key,
                            dict(manifest.get("per_split", {})))

    counts: dict[str, Counter[str]] = defaultdict(Counter)
    details: dict[str, object] = {"source": {"files": [f.name for f in files], "options": options.describe()}}
    bar = progress_bar(None, f"ingest {dataset}", "sentences", enabled=progress)
    with TableWriter(sentences_dir, SENTENCES, key, details) as writer:
        rows: list[dict[str, object]] = []
        sentence_id = 0
        for path in files:
            assign_user = _user_assigner(path, options)
            positions: Counter[str] = Counter()
            for index, record in enumerate(records_for(path, options)):
                user = assign_user(index, record)
                split = _split_of(path, record, user, options)
                counts[user][split] += 1
                rows.append({
                    "sentence_id": sentence_id, "user_id": user, "doc_id": record.doc_id, "split": split,
                    "position": positions[record.doc_id], "text": record.text, "label": record.label,
                    "source_file": path.name, "source_line": record.line, "gold_spans": record.gold_spans,
                })
                positions[record.doc_id] += 1
                sentence_id += 1
                if len(rows) >= BATCH_ROWS:
                    writer.write_rows(rows)
                    bar.update(len(rows))
                    rows = []
        writer.write_rows(rows)
        bar.update(len(rows))
        per_split = {s: sum(c[s] for c in counts.values()) for s in SPLITS}
        writer.details["per_split"] = per_split
        # Written inside the sentences' context: a failure here discards both tables.
        with TableWriter(users_dir, USERS, key, details) as users_writer:
            users_writer.write_rows([
                {"user_id": user, "n_sentences": sum(c.values()), **{f"n_{s}": c[s] for s in SPLITS}}
                for user, c in counts.items()
            ])
    bar.close()
    return IngestResult(dataset, False, writer.rows, len(counts), key, per_split)


def conll_options(split_seed: int | None = None) -> IngestOptions:
    """CoNLL-2003 options: splits from the file names, or whole users by a hash seeded with ``split_seed``."""
    if split_seed is None:
        return IngestOptions(format="conll2003")
    return IngestOptions(format="conll2003", split="users", split_by_user=SplitByUser(seed=split_seed))
