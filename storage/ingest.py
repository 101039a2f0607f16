"""Turn corpus files of any supported format into the ``sentences`` and ``users`` tables, idempotently.

"User" is the privacy unit, so how records become users is explicit (``IngestOptions.users``) and
recorded in the manifest. The content key of an ingest is the hash of the input bytes plus the
options; when the existing tables carry the same key nothing is rewritten and the caller is told the
data was reused. Both tables go through :class:`storage.tables.TableWriter`: a bad line anywhere in
the input leaves the previous tables (or none) in place. Readers stream, so memory stays bounded by
one batch of rows plus one counter per user.

Formats are not named here: each registers itself (:mod:`uedp.storage.formats.registry`) with its reader,
its users and its checks. Every ingest setting is declared once, in :class:`IngestOptions`, which the
Prefect form (``uedp.flows.ingest.IngestConfig``) extends and from which ``uedp ingest`` derives its flags.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from uedp.errors import UedpError
from uedp.progress import progress as progress_bar
from uedp.storage.formats import FormatError, SourceRecord, split_from_filename
from uedp.storage.formats.registry import formats, get_format, user_fix
from uedp.storage.home import DataHome
from uedp.storage.schemas import DOCUMENT_TAGS, DOCUMENT_TAGS_FILE, SCHEMA_VERSION, SENTENCES, SPLITS, USERS
from uedp.storage.tables import TableWriter, hash_config, hash_files, is_current, read_manifest
from uedp.storage.text_identity import TEXT_KEY, sentence_digest, text_key

# Derived from the format registry (uedp's own formats, as registered at import; the registry itself is
# the live list): the names, those whose files carry entity tags (what the ``gold`` detector reads), and
# the user strategy each uses when none is given.
FORMATS: tuple[str, ...] = tuple(formats())
GOLD_FORMATS: frozenset[str] = frozenset(name for name, f in formats().items() if f.gold)
DEFAULT_USERS: dict[str, str] = {name: f.default_users for name, f in formats().items()}
SplitMode = Literal["auto", "files", "users"]
BATCH_ROWS = 10_000


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


def _users_help() -> str:
    fixed = ", ".join(f"{name}: {f.default_users}" for name, f in formats().items() if f.fixed_users)
    chosen = ", ".join(f"{name}: {f.default_users}" for name, f in formats().items() if not f.fixed_users)
    return ("who the users (privacy units) are: 'source' (ag_news' news agency), 'chunk:N' (pseudo-users of N "
            f"consecutive records) or 'column' (--user-col); fixed by the format for {fixed}; default {chosen}")


class IngestOptions(BaseModel):
    """How to read the files and who the users are: every ingest setting, declared once (the Prefect form
    and ``uedp ingest``'s flags derive from these fields). Every field is part of the content key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str = Field(description=f"the corpus format: {', '.join(FORMATS)}")
    users: str | None = Field(None, description=_users_help())
    text_col: str | None = Field(None, description="jsonl/csv: the column holding the text")
    user_col: str | None = Field(None, description="jsonl/csv: the column naming each record's writer (the privacy "
                                 "unit of user-level mechanisms)")
    label_col: str | None = Field(None, description="jsonl/csv: a class label column to keep (classification)")
    split_col: str | None = Field(None, description="jsonl/csv: a column holding train, valid or test")
    split: SplitMode = Field("auto", description="auto: from file names or --split-col, else by user; files: from "
                             "those only; users: whole users by a seeded hash")
    split_seed: int = Field(0, description="seed of the by-user split's hash")
    valid_fraction: float = Field(0.1, ge=0, lt=1, description="by-user split: share of users in valid")
    test_fraction: float = Field(0.1, ge=0, lt=1, description="by-user split: share of users in test")
    detokenize: bool = Field(False, description="wikitext: undo @-@ and the tokenised spacing of punctuation")
    sec_document_types: list[str] = Field(default_factory=list, description="sec raw submissions: document types to "
                                          "read (e.g. 10-K, EX-99.1); empty: the submission's own type")
    split_of: dict[str, str] = Field(default_factory=dict, description="which split a whole file is (train, valid or "
                                     "test), for files whose names do not say: file name -> split, or FILE=SPLIT "
                                     "(--split-of notes.txt=train, repeatable)")

    @field_validator("split_of", mode="before")
    @classmethod
    def _file_splits(cls, value: Any) -> dict[str, str]:
        """``{name: split}``, ``[(name, split)]`` or ``["name=split"]``; a path names its file. Sorted by
        file name (as the content key has always had them)."""
        if value is None:
            return {}
        if isinstance(value, str):
            value = [value]
        items = list(value.items()) if isinstance(value, Mapping) else list(value)
        pairs: list[tuple[str, str]] = []
        for item in items:
            if isinstance(item, str):
                file_name, sep, role = item.rpartition("=")
                if not sep or not file_name or not role.strip():
                    raise UedpError(f"--split-of {item!r}: expected FILE=SPLIT, e.g. notes.txt=train")
                item = (file_name, role)
            file_name, role = (str(part).strip() for part in item)
            pairs.append((Path(file_name).name, role))
        for file_name, role in pairs:
            if role not in SPLITS:
                raise UedpError(f"--split-of {file_name}={role}: the split must be one of {', '.join(SPLITS)}")
        named = [file_name for file_name, _ in pairs]
        if len(set(named)) != len(named):
            raise UedpError("--split-of names a file twice")
        return dict(sorted(pairs))

    @model_validator(mode="after")
    def _check(self) -> IngestOptions:
        _ = self.split_by_user  # SplitByUser refuses fractions that leave no train split
        corpus_format = get_format(self.format)
        strategy = self.user_strategy
        if corpus_format.fixed_users and strategy != corpus_format.default_users:
            raise UedpError(f"format {self.format} has fixed users ({corpus_format.default_users}); drop --users")
        if corpus_format.check is not None:
            corpus_format.check(self)
        if strategy.startswith("chunk:"):
            size = strategy.removeprefix("chunk:")
            if not size.isdigit() or int(size) < 1:
                raise UedpError(f"invalid user strategy {strategy!r}: chunk size must be a positive integer")
        return self

    @property
    def user_strategy(self) -> str:
        return self.users or get_format(self.format).default_users

    @property
    def split_by_user(self) -> SplitByUser:
        return SplitByUser(self.split_seed, self.valid_fraction, self.test_fraction)

    def describe(self) -> dict[str, object]:
        """The options as the content key and the manifest record them. This is the dict the options'
        former dataclass gave (``asdict`` plus the resolved user strategy): any change to it re-ingests
        every existing dataset."""
        return {
            "format": self.format, "users": self.user_strategy, "text_col": self.text_col, "user_col": self.user_col,
            "label_col": self.label_col, "split_col": self.split_col, "split": self.split,
            "split_by_user": {"seed": self.split_seed, "valid_fraction": self.valid_fraction,
                              "test_fraction": self.test_fraction},
            "detokenize": self.detokenize, "sec_document_types": tuple(self.sec_document_types),
            "split_of": tuple(self.split_of.items()),
        }

    def role_of(self, path: Path) -> str | None:
        """The split a whole file is: given with ``split_of`` (by name), else read from its name."""
        return self.split_of.get(path.name) or split_from_filename(path)


def file_roles(files: list[Path], options: IngestOptions) -> list[str | None]:
    """Each input's split as the file level sees it; part of the content key, so renaming
    ``a.txt`` to ``train.txt`` (or a new ``--split-of``) is a different ingest, not a reuse."""
    given = set(options.split_of)
    unknown = sorted(given - {path.name for path in files})
    if unknown:
        raise UedpError(f"--split-of names {', '.join(unknown)}, which is not among the input files "
                        f"({', '.join(path.name for path in files)})")
    return [options.role_of(path) for path in files]


# User structures user-level DP cannot work with: a handful of users, or one holding a large share of the
# training text (its noise is set for one user's worth; a user holding a fifth of it is most of the signal).
FEW_USERS = 20
LARGEST_SHARE = 0.2
@dataclass(frozen=True)
class UserStructure:
    """How the train split's sentences spread over users, for the ingest's warning (the curator's terminal)."""

    train_users: int = 0
    largest_user: str = ""
    largest_share: float = 0.0

    @classmethod
    def of(cls, counts: dict[str, Counter[str]]) -> UserStructure:
        train = {user: c["train"] for user, c in counts.items() if c["train"]}
        total = sum(train.values())
        if not total:
            return cls()
        largest = max(train, key=lambda user: train[user])
        return cls(len(train), largest, train[largest] / total)


@dataclass(frozen=True)
class IngestResult:
    dataset: str
    reused: bool
    sentences: int
    users: int
    key: str
    per_split: dict[str, int] = field(default_factory=dict)
    structure: UserStructure = field(default_factory=UserStructure)
    format: str = ""
    folders: dict[str, list[str]] = field(default_factory=dict)  # a folder given -> the files it stood for
    public: str = ""  # what changed in its public declaration (services.public_datasets), said to the user

    @property
    def user_warning(self) -> str | None:
        """A user structure too degenerate for user-level DP, said at ingest with what fixes it."""
        s = self.structure
        if not s.train_users or (s.train_users >= FEW_USERS and s.largest_share <= LARGEST_SHARE):
            return None
        shape = (f"only {s.train_users} user{'s' if s.train_users != 1 else ''} in the train split"
                 if s.train_users < FEW_USERS else f"{s.largest_user!r} holds {s.largest_share:.0%} of the train split")
        return (f"{self.dataset}: {shape}; user-level DP (userdp, uedp) protects each user by adding noise for one "
                f"user's worth of text, so this structure will learn little or leak a large user's text. "
                f"{user_fix(self.format)}")

    @property
    def warning(self) -> str | None:
        """What will fail later, said now: a dataset without a train split cannot be trained on, and one
        without a test split cannot be evaluated."""
        if self.per_split.get("train"):
            if self.per_split.get("test"):
                return None
            return (f"dataset {self.dataset!r} has no test split: `uedp train` will refuse it (a run could not be "
                    "evaluated); say which file is held out with --split-of FILE=test, or --split users")
        return (f"dataset {self.dataset!r} has no train split ({', '.join(f'{s} {n}' for s, n in self.per_split.items() if n) or 'no sentences'}): "
                "`uedp train` will refuse it; say which file is which with --split-of FILE=train, or --split users")


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


def _split_of(path: Path, record: SourceRecord, user: str, options: IngestOptions,
              by_user: Callable[[str], str]) -> str:
    if path.name in options.split_of:  # the user's word for the whole file beats its name and columns
        return options.split_of[path.name]
    if options.split == "users" or (options.split == "auto" and record.split is None):
        return by_user(user)
    if record.split is None:
        raise FormatError(path, record.line, "--split files, but neither the file name nor a split column gives a split")
    return record.split


def ingest(home: DataHome, dataset: str, files: list[Path], options: IngestOptions,
           progress: bool = False) -> IngestResult:
    """Ingest ``files`` as ``dataset``; reuse the existing tables when inputs and options are unchanged."""
    files, folders = files_of(files, options.format)
    if not files:
        raise UedpError("no input files given")
    for path in files:  # fail on a missing or empty file before hashing, with the reader's message
        check_input_file(path)
    key = hash_config({"inputs": hash_files(files), "roles": file_roles(files, options), "options": options.describe(),
                       "schema": SCHEMA_VERSION})
    sentences_dir, users_dir = home.table_dir(dataset, "sentences"), home.table_dir(dataset, "users")
    if is_current(sentences_dir, key) and is_current(users_dir, key):
        manifest = read_manifest(sentences_dir) or {}
        return IngestResult(dataset, True, int(manifest["rows"]), int((read_manifest(users_dir) or {})["rows"]), key,
                            dict(manifest.get("per_split", {})), UserStructure(**manifest.get("user_structure", {})),
                            options.format, folders)

    dataset_dir = home.dataset_dir(dataset)
    new = not dataset_dir.exists()
    try:
        return replace(_write_tables(home, dataset, files, options, key, progress), folders=folders)
    except BaseException:
        if new:  # a first ingest that failed leaves no dataset behind (`uedp datasets` would list it)
            remove_if_empty(dataset_dir)
        raise


def check_input_file(path: Path) -> None:
    """A corpus file must exist, be a regular file and hold something (a 0-byte file holds no sentence in any
    format: a mistake, such as a failed download or a wrong name)."""
    if not path.is_file():
        raise FormatError(path, None, "file not found" if not path.exists() else "not a regular file")
    if path.stat().st_size == 0:
        raise FormatError(path, None, "empty file (0 bytes)")


def check_local_inputs(paths: Sequence[str], file_format: str) -> None:
    """What :func:`ingest` checks before reading, for the inputs given as local paths (a URL or a bundled corpus
    is fetched by the flow first): ``uedp ingest`` refuses a missing or empty file before Prefect starts."""
    local = [p for p in paths if "://" not in p and not p.startswith("bundled:")]
    for path in files_of(local, file_format)[0]:
        check_input_file(path)


def files_of(paths: Sequence[str | Path], file_format: str) -> tuple[list[Path], dict[str, list[str]]]:
    """The files to read: each path as given, and a folder as its files of ``file_format``
    (``CorpusFormat.file_patterns``, sorted, once each). Also which files each folder stood for, to name
    them. A folder without such files is an error naming the folder and the patterns."""
    patterns = get_format(file_format).file_patterns
    files: list[Path] = []
    folders: dict[str, list[str]] = {}
    for given in paths:
        path = Path(given).expanduser()
        if not path.is_dir():
            files.append(path)
            continue
        found = sorted({p for pattern in patterns for p in path.glob(pattern) if p.is_file()})
        if not found:
            raise UedpError(f"{path}: a folder with no {file_format} files ({', '.join(patterns)}); name the files, or "
                            "give the folder that holds them")
        folders[str(path)] = [str(p.relative_to(path)) for p in found]
        files.extend(found)
    return files, folders


def remove_if_empty(folder: Path) -> None:
    """Remove a dataset's folder a failed first ingest made, unless something else was written there since
    (a concurrent ingest's table, or a temporary of a live writer): only empty folders go."""
    with contextlib.suppress(OSError):
        folder.rmdir()


def _write_tables(home: DataHome, dataset: str, files: list[Path], options: IngestOptions, key: str,
                  progress: bool) -> IngestResult:
    """Both tables from the files, each swapped in whole only when every record was read (TableWriter)."""
    sentences_dir, users_dir = home.table_dir(dataset, "sentences"), home.table_dir(dataset, "users")
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    details: dict[str, object] = {"source": {"files": [f.name for f in files], "options": options.describe()}}
    bar = progress_bar(None, f"ingest {dataset}", "sentences", enabled=progress)
    with TableWriter(sentences_dir, SENTENCES, key, details) as writer:
        rows: list[dict[str, object]] = []
        tags: list[dict[str, str]] = []  # documents' metadata, long form
        digests: list[bytes] = []  # the text key: which text this is, whatever its name, split or users
        sentence_id = 0
        read, by_user = get_format(options.format).read, options.split_by_user
        for path in files:
            assign_user = _user_assigner(path, options)
            positions: Counter[str] = Counter()
            for index, record in enumerate(read(path, options)):
                user = assign_user(index, record)
                split = _split_of(path, record, user, options, by_user)
                counts[user][split] += 1
                digests.append(sentence_digest(record.text))
                rows.append({
                    "sentence_id": sentence_id, "user_id": user, "doc_id": record.doc_id, "split": split,
                    "position": positions[record.doc_id], "text": record.text, "label": record.label,
                    "source_file": path.name, "source_line": record.line, "gold_spans": record.gold_spans,
                })
                positions[record.doc_id] += 1
                tags.extend({"doc_id": record.doc_id, "tag": tag, "value": value}
                            for tag, values in record.doc_tags.items() for value in values)
                sentence_id += 1
                if len(rows) >= BATCH_ROWS:
                    writer.write_rows(rows)
                    bar.update(len(rows))
                    rows = []
        writer.write_rows(rows)
        bar.update(len(rows))
        if tags:
            pq.write_table(pa.Table.from_pylist(tags, schema=DOCUMENT_TAGS), writer.side_file(DOCUMENT_TAGS_FILE))
            writer.details["documents"] = {"file": DOCUMENT_TAGS_FILE, "tags": sorted({t["tag"] for t in tags})}
        per_split = {s: sum(c[s] for c in counts.values()) for s in SPLITS}
        writer.details["per_split"] = per_split
        writer.details[TEXT_KEY] = text_key(digests)
        structure = UserStructure.of(counts)
        writer.details["user_structure"] = asdict(structure)
        # Written inside the sentences' context: a failure here discards both tables.
        with TableWriter(users_dir, USERS, key, details) as users_writer:
            users_writer.write_rows([
                {"user_id": user, "n_sentences": sum(c.values()), **{f"n_{s}": c[s] for s in SPLITS}}
                for user, c in counts.items()
            ])
    bar.close()
    return IngestResult(dataset, False, writer.rows, len(counts), key, per_split, structure, options.format)


def conll_options(split_seed: int | None = None) -> IngestOptions:
    """CoNLL-2003 options: splits from the file names, or whole users by a hash seeded with ``split_seed``."""
    if split_seed is None:
        return IngestOptions(format="conll2003")
    return IngestOptions(format="conll2003", split="users", split_seed=split_seed)
