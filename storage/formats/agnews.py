"""AG News: the ``class,title,description`` CSV of the original release (no header, every field
quoted, backslashes for line breaks, ``#39;``-style entities) or with a header, and the same data as
JSONL (``{"text", "label"}`` as on the Hugging Face hub, or ``{"title", "description", "label"}``).

The class is kept as the record's label (classification). A news item is one unit of text; users
come from the ingest's user strategy, helped by the news source parsed from the description
(``"Reuters - ..."``, ``"WASHINGTON (AP) - ..."``), which this reader records as a hint.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from uedp.errors import UedpError
from uedp.storage.formats import FormatError, SourceRecord, read_csv_rows, read_json_objects, split_from_filename
from uedp.storage.formats.registry import CorpusFormat, looks_like_json, register_format

if TYPE_CHECKING:
    from uedp.storage.ingest import IngestOptions

_BACKSLASHES = re.compile(r"\\+")
_NUMERIC_ENTITY = re.compile(r"(?<![&\w])#(\d{2,4});")
_SPACES = re.compile(r"\s+")
_PAREN_SOURCE = re.compile(r"\(([A-Za-z][A-Za-z0-9.&' ]{0,40})\)\s*-{1,2}\s")
_PREFIX_SOURCE = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9.&']*(?: [A-Z][A-Za-z0-9.&']*){0,3})\s+-{1,2}\s")
SOURCE_WINDOW = 200  # the credit line sits at the start of the description


def clean_text(text: str) -> str:
    """Undo AG News' escapes: backslash line breaks, bare ``#39;`` entities, HTML entities, spacing."""
    text = _BACKSLASHES.sub(" ", text)
    text = _NUMERIC_ENTITY.sub(lambda m: chr(int(m.group(1))), text)
    return _SPACES.sub(" ", html.unescape(text)).strip()


def news_source(description: str) -> str | None:
    """The agency an item credits: ``(Reuters)`` before a dash, or a ``Reuters - `` prefix."""
    head = description[:SOURCE_WINDOW]
    match = _PAREN_SOURCE.search(head) or _PREFIX_SOURCE.search(head)
    return match.group(1).strip() if match else None


def _record(path: Path, line: int, label: str, title: str, description: str, split: str | None) -> SourceRecord:
    if not label.strip().lstrip("-").isdigit():
        raise FormatError(path, line, f"class must be an integer, got {label!r}")
    title, description = clean_text(title), clean_text(description)
    text = f"{title}. {description}" if title and description else title or description
    if not text:
        raise FormatError(path, line, "empty title and description")
    return SourceRecord(text=text, user=None, doc_id=f"{path.name}:{line}", line=line, split=split,
                        label=label.strip(), source_user_hint=news_source(description))


def agnews_csv_records(path: Path) -> Iterator[SourceRecord]:
    split = split_from_filename(path)
    produced = False
    for line, row in read_csv_rows(path):
        if not produced and row[0].strip().lower() in ("class index", "class", "label"):
            continue  # header of the common re-distributions
        if len(row) != 3:
            raise FormatError(path, line, f"expected 3 columns (class,title,description), got {len(row)}")
        yield _record(path, line, row[0], row[1], row[2], split)
        produced = True
    if not produced:
        raise FormatError(path, None, "no records found (empty file?)")


def agnews_jsonl_records(path: Path) -> Iterator[SourceRecord]:
    split = split_from_filename(path)
    produced = False
    for line, obj in read_json_objects(path):
        label = obj.get("label", obj.get("class"))
        if label is None:
            raise FormatError(path, line, "missing 'label' (or 'class') field")
        if "text" in obj:
            yield _record(path, line, str(label), "", str(obj["text"]), split)
        elif "title" in obj or "description" in obj:
            yield _record(path, line, str(label), str(obj.get("title", "")), str(obj.get("description", "")), split)
        else:
            raise FormatError(path, line, "missing 'text' (or 'title'/'description') field")
        produced = True
    if not produced:
        raise FormatError(path, None, "no records found (empty file?)")


def _read(path: Path, options: IngestOptions) -> Iterator[SourceRecord]:
    return agnews_jsonl_records(path) if looks_like_json(path) else agnews_csv_records(path)


def _check(options: IngestOptions) -> None:
    strategy = options.user_strategy
    if not (strategy == "source" or strategy.startswith("chunk:")):
        raise UedpError("ag_news users: 'source' (news agency) or 'chunk:N' (pseudo-users of N records)")


register_format(CorpusFormat(
    name="ag_news", summary="AG News as CSV or JSONL, users by news agency or in chunks",
    read=_read, default_users="source", check=_check,
    file_patterns=("*.csv", "*.jsonl"),
))
