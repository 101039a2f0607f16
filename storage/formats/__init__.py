"""Streaming readers for the corpus formats uedp ingests.

Every reader yields :class:`SourceRecord` values one at a time (bounded memory for any input size)
and raises :class:`FormatError` naming the file and line of the first bad input.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import lzma
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from uedp.errors import UedpError


class FormatError(UedpError):
    def __init__(self, path: Path, line: int | None, problem: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path, self.line, self.problem = path, line, problem


@dataclass
class SourceRecord:
    """One text unit (a sentence, or a record for classification corpora) as read from a file."""

    text: str
    user: str | None  # None: the ingest's user strategy assigns one
    doc_id: str
    line: int  # 1-based line in the source file where the unit starts
    split: str | None = None  # from the source (file name or a column); None: assigned by user
    label: str | None = None
    gold_spans: list[dict[str, object]] = field(default_factory=list)
    source_user_hint: str | None = None  # e.g. the news source of an AG News record
    # Metadata of the record's document (Reuters' PLACES, PEOPLE, ORGS): tag -> values, given once per
    # document (on its first record); ingest writes it as the table's ``documents.parquet``.
    doc_tags: dict[str, list[str]] = field(default_factory=dict)


def open_binary(path: Path) -> IO[bytes] | gzip.GzipFile:  # GzipFile is no IO[bytes]: its mode is not a str
    """Open a file, transparently decompressing .gz, .bz2 and .xz (corpora are often shipped so)."""
    if not path.exists():
        raise FormatError(path, None, "file not found")
    if not path.is_file():
        raise FormatError(path, None, "not a regular file")
    suffix = path.suffix.lower()
    if suffix == ".gz":
        return gzip.open(path, "rb")
    if suffix == ".bz2":
        return bz2.open(path, "rb")
    if suffix == ".xz":
        return lzma.open(path, "rb")
    return open(path, "rb")


BOM = b"\xef\xbb\xbf"
# Python's csv module refuses fields over 128 KiB; a filing or an article body is often longer.
CSV_FIELD_LIMIT = 64 << 20


def _decoded(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line with its newline)`` decoded as strict UTF-8, the UTF-8 byte-order mark at
    the start of the file dropped (editors on Windows write one). A bad byte is named by its line and
    column in the file, not by an offset inside a decoder's buffer."""
    with open_binary(path) as handle:
        for lineno, raw in enumerate(handle, start=1):
            if lineno == 1 and raw.startswith(BOM):
                raw = raw[len(BOM):]
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                column = len(raw[:exc.start].decode("utf-8", errors="replace")) + 1
                raise FormatError(path, lineno, f"invalid UTF-8 (byte 0x{raw[exc.start]:02x}) at column {column}; "
                                  "save the file as UTF-8") from None


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line without its newline)``, decoded as strict UTF-8 (errors name line and column)."""
    for lineno, text in _decoded(path):
        yield lineno, text.rstrip("\r\n")


EXCERPT_CHARS = 30  # characters shown on each side of a JSON syntax error


def json_excerpt(text: str, position: int, width: int = EXCERPT_CHARS) -> str:
    """The text around a syntax error, quoted, with ``>>>`` where the parser stopped: enough to find it in
    an editor, short enough for one line (a JSONL line may hold a whole filing)."""
    before = text[max(0, position - width):position].replace("\n", " ")
    after = text[position:position + width].replace("\n", " ")
    return f"{'...' if position > width else ''}{before}>>>{after}{'...' if position + width < len(text) else ''}"


def json_problem(exc: json.JSONDecodeError, text: str) -> str:
    """``invalid JSON: Expecting ',' delimiter at column 41: ...text>>>around it...``"""
    where = "column" if exc.msg.endswith(" at") else "at column"
    return f"invalid JSON: {exc.msg} {where} {exc.colno}: {json_excerpt(text, exc.pos)}"


def read_json_objects(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    """``(line number, object)`` of a JSONL file; blank lines skipped, anything but an object is an error.
    A syntax error names its line and column and shows the text around it."""
    for lineno, text in read_lines(path):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FormatError(path, lineno, json_problem(exc, text)) from None
        if not isinstance(obj, dict):
            raise FormatError(path, lineno, "expected a JSON object per line")
        yield lineno, obj


def read_csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line where the row starts, fields)`` of a CSV file (quoted fields may span lines); blank rows
    skipped. Decoding is line by line (:func:`_decoded`), so errors name the true line and column."""
    if csv.field_size_limit() < CSV_FIELD_LIMIT:
        csv.field_size_limit(CSV_FIELD_LIMIT)
    reader = csv.reader(text for _, text in _decoded(path))
    previous = 0
    try:
        for row in reader:
            start, previous = previous + 1, reader.line_num
            if row:
                yield start, row
    except csv.Error as exc:
        raise FormatError(path, previous + 1, f"malformed CSV: {exc}") from None


_SPLIT_WORDS = {
    "train": "train", "training": "train",
    "valid": "valid", "validation": "valid", "validate": "valid", "dev": "valid", "testa": "valid",
    "test": "test", "testb": "test",
}


def split_from_filename(path: Path) -> str | None:
    """The split a file's name declares (``eng.testa``, ``wiki.valid.tokens``, ``train.csv``,
    ``validation.jsonl.gz``), or None when the name says nothing."""
    words = re.split(r"[^a-z]+", path.name.lower())
    found = {_SPLIT_WORDS[w] for w in words if w in _SPLIT_WORDS}
    return found.pop() if len(found) == 1 else None
