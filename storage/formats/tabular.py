"""Any other corpus as JSONL or CSV (with a header row): ``text_col`` names the text, ``user_col``
the privacy unit, and optionally ``label_col`` and ``split_col``. One row is one unit of text.

The ``csv`` format also reads tab-separated files, told apart by their name (``.tsv``, ``.tsv.gz``):
one row per line, fields split at tabs, no quoting, as GLUE ships SST-2 and the other benchmarks
(a quote character is text there: ``"`` read as CSV quoting would swallow the lines that follow)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uedp.errors import UedpError
from uedp.storage.formats import (
    FormatError,
    SourceRecord,
    read_csv_rows,
    read_json_objects,
    read_lines,
    split_from_filename,
)
from uedp.storage.formats.registry import CorpusFormat, register_format

if TYPE_CHECKING:
    from uedp.storage.ingest import IngestOptions

SPLIT_VALUES = {"train": "train", "valid": "valid", "validation": "valid", "dev": "valid", "test": "test"}


def _record(path: Path, line: int, row: dict[str, Any], text_col: str, user_col: str | None,
            label_col: str | None, split_col: str | None, file_split: str | None) -> SourceRecord | None:
    for column in (text_col, user_col, label_col, split_col):
        if column and column not in row:
            raise FormatError(path, line, f"missing column {column!r} (columns: {', '.join(map(str, row))})")
    text = str(row[text_col] if row[text_col] is not None else "").strip()
    if not text:
        return None
    user = str(row[user_col]).strip() if user_col else None
    if user_col and not user:
        raise FormatError(path, line, f"empty user in column {user_col!r}")
    split = file_split
    if split_col:
        value = str(row[split_col]).strip().lower()
        if value not in SPLIT_VALUES:
            raise FormatError(path, line, f"unknown split {row[split_col]!r} (expected train, valid or test)")
        split = SPLIT_VALUES[value]
    label = str(row[label_col]) if label_col and row[label_col] is not None else None
    return SourceRecord(text=" ".join(text.split()), user=user, doc_id=f"{path.name}:{line}", line=line,
                        split=split, label=label)


def jsonl_records(path: Path, text_col: str, user_col: str | None = None, label_col: str | None = None,
                  split_col: str | None = None) -> Iterator[SourceRecord]:
    file_split, produced = split_from_filename(path), False
    for line, row in read_json_objects(path):
        record = _record(path, line, row, text_col, user_col, label_col, split_col, file_split)
        if record:
            produced = True
            yield record
    if not produced:
        raise FormatError(path, None, "no records with text found (empty file?)")


def is_tsv(path: Path) -> bool:
    """Whether a file of the ``csv`` format is tab-separated, by its name (``train.tsv``, ``dev.tsv.gz``)."""
    return ".tsv" in path.name.lower()


def read_tsv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line, fields)`` of a tab-separated file: one row per line, split at every tab, no quoting (IANA
    text/tab-separated-values); blank lines skipped. Decoding errors name the line and column."""
    for line, text in read_lines(path):
        if text.strip():
            yield line, text.split("\t")


def _header_records(path: Path, rows: Iterable[tuple[int, list[str]]], what: str, text_col: str,
                    user_col: str | None, label_col: str | None, split_col: str | None) -> Iterator[SourceRecord]:
    """Records of a table whose first row is its header; a row with another number of fields is an error
    naming its file and line."""
    file_split, produced = split_from_filename(path), False
    header: list[str] | None = None
    for line, row in rows:
        if header is None:
            header = row
            continue
        if len(row) != len(header):
            raise FormatError(path, line, f"expected {len(header)} {what} like the header, got {len(row)}")
        record = _record(path, line, dict(zip(header, row)), text_col, user_col, label_col, split_col, file_split)
        if record:
            produced = True
            yield record
    if not produced:
        raise FormatError(path, None, "no records with text found" if header else "empty file (expected a header row)")


def csv_records(path: Path, text_col: str, user_col: str | None = None, label_col: str | None = None,
                split_col: str | None = None) -> Iterator[SourceRecord]:
    return _header_records(path, read_csv_rows(path), "columns", text_col, user_col, label_col, split_col)


def tsv_records(path: Path, text_col: str, user_col: str | None = None, label_col: str | None = None,
                split_col: str | None = None) -> Iterator[SourceRecord]:
    return _header_records(path, read_tsv_rows(path), "tab-separated columns", text_col, user_col, label_col,
                           split_col)


def _read_jsonl(path: Path, options: IngestOptions) -> Iterator[SourceRecord]:
    return jsonl_records(path, options.text_col or "", options.user_col, options.label_col, options.split_col)


def _read_csv(path: Path, options: IngestOptions) -> Iterator[SourceRecord]:
    records = tsv_records if is_tsv(path) else csv_records
    return records(path, options.text_col or "", options.user_col, options.label_col, options.split_col)


TABULAR_FIX = ("--user-col names a writer column, or ingest again with --users chunk:N (pseudo-users of N "
               "consecutive records)")


def _check(options: IngestOptions) -> None:
    if not options.text_col:
        raise UedpError(f"format {options.format} needs --text-col")
    if options.user_strategy == "column" and not options.user_col:
        raise UedpError(f"format {options.format} needs --user-col, or --users chunk:N")


register_format(CorpusFormat(
    name="jsonl", summary="any corpus as JSON lines, with --text-col and --user-col (or --users chunk:N)",
    read=_read_jsonl, default_users="column", check=_check, more_users=TABULAR_FIX, file_patterns=("*.jsonl",),
))
register_format(CorpusFormat(
    name="csv", summary="any corpus as CSV with a header row, with --text-col and --user-col (or --users chunk:N)",
    read=_read_csv, default_users="column", check=_check, more_users=TABULAR_FIX, file_patterns=("*.csv",),
))
