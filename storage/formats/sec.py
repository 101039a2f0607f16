"""SEC EDGAR filings, in the three forms people download them in.

* EDGAR-CORPUS JSONL: one filing per line, ``{"filename", "cik", "year", "section_1", "section_1A",
  ..., "section_15"}``; every ``section_*`` field is text.
* JSON documents, one filing per file (or a JSON array of filings), as crawlers of EDGAR write them:
  ``{"cik": ..., "names": [...], "item1": ..., "item1a": ..., "item7": ...}`` (also ``item_1``,
  ``item_7A``, ``section_1``); every item or section field is text, every other field is metadata.
* Raw EDGAR full-submission text files (``0000320193-20-000096.txt``): an SGML header
  (``<SEC-HEADER>`` with ``CENTRAL INDEX KEY:`` and ``CONFORMED SUBMISSION TYPE:``) followed by
  ``<DOCUMENT>`` blocks whose ``<TEXT>`` is HTML, plain text or uuencoded binary. By default only the
  documents of the submission's own type are read (the 10-K itself, not its exhibits and images);
  HTML is reduced to its visible text (scripts, styles and hidden inline-XBRL headers dropped).

One filer (CIK) is one user. Text is split into sentences with spaCy's rule-based sentencizer.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING

from uedp.storage.formats import (
    FormatError,
    SourceRecord,
    json_problem,
    read_json_objects,
    read_lines,
    split_from_filename,
)
from uedp.storage.formats.registry import CorpusFormat, looks_like_json, register_format
from uedp.storage.formats.sentences import split_sentences

if TYPE_CHECKING:
    from uedp.storage.ingest import IngestOptions

# The text fields of a filing: EDGAR-CORPUS' section_1A, a crawler's item1a / item_1A / "Item 1A".
_SECTION = re.compile(r"^(?:section|item)[_ ]?\d+[a-z]?$", re.IGNORECASE)
FORMS = ("EDGAR-CORPUS JSONL (one filing per line), a JSON document per filing or a JSON array of filings "
         "(each with a 'cik' and 'section_*' or 'item*' text fields), or raw EDGAR full-submission .txt files "
         "(an <SEC-HEADER> with CENTRAL INDEX KEY)")
_HEADER_FIELD = re.compile(r"^\s*([A-Z][A-Z /-]+):\s*(.*?)\s*$")
_SPACES = re.compile(r"[ \t\r\f\v\xa0]+")


def _paragraphs_of(text: str) -> list[str]:
    """Paragraphs of plain text: blank-line separated blocks, whitespace collapsed."""
    blocks = re.split(r"\n\s*\n", text)
    return [p for p in (_SPACES.sub(" ", b.replace("\n", " ")).strip() for b in blocks) if p]


class _VisibleText(HTMLParser):
    """Collects the text a browser would show, one paragraph per block element.

    A hidden region (script, style, head, inline-XBRL header, or any element styled display:none)
    lasts until the end tag matching the tag that opened it, counting nested tags of the same name.
    """

    BLOCKS = {"p", "div", "br", "tr", "li", "h1", "h2", "h3", "h4", "h5", "h6", "table", "section", "td", "title"}
    HIDDEN = {"script", "style", "ix:header", "head"}
    VOID = {"br", "img", "hr", "meta", "link", "input", "col", "area", "base", "wbr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden_tag: str | None = None
        self.hidden_nesting = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.hidden_tag is not None:
            self.hidden_nesting += tag == self.hidden_tag
            return
        style = (dict(attrs).get("style") or "").replace(" ", "").lower()
        if tag not in self.VOID and (tag in self.HIDDEN or "display:none" in style):
            self.hidden_tag, self.hidden_nesting = tag, 1
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if self.hidden_tag is not None:
            if tag == self.hidden_tag:
                self.hidden_nesting -= 1
                if self.hidden_nesting == 0:
                    self.hidden_tag = None
            return
        if tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self.hidden_tag is None:
            self.parts.append(data)


def html_paragraphs(markup: str) -> list[str]:
    parser = _VisibleText()
    parser.feed(markup)
    parser.close()
    return _paragraphs_of("".join(parser.parts))


def _sentences(path: Path, units: Iterator[tuple[str, str, int, str]]) -> Iterator[SourceRecord]:
    """Split ``(user, doc_id, line, paragraph)`` units into sentence records, streaming."""
    split = split_from_filename(path)
    pending: deque[tuple[str, str, int]] = deque()

    def texts() -> Iterator[str]:
        for user, doc_id, line, paragraph in units:
            pending.append((user, doc_id, line))
            yield paragraph

    for sentences in split_sentences(texts()):
        user, doc_id, line = pending.popleft()
        for sentence in sentences:
            yield SourceRecord(text=sentence, user=user, doc_id=doc_id, line=line, split=split)


def edgar_corpus_records(path: Path) -> Iterator[SourceRecord]:
    """EDGAR-CORPUS JSONL, or a JSON document (one filing, or an array of filings), told apart by whether
    the first line is a whole JSON value."""
    yield from _require_some(path, _sentences(path, _json_filing_units(path)))


def _json_filing_units(path: Path) -> Iterator[tuple[str, str, int, str]]:
    first = next(((line, text) for line, text in read_lines(path) if text.strip()), None)
    if first is None:
        return
    if _whole_json_line(first[1]):
        for line, filing in read_json_objects(path):
            yield from _filing_units(path, line, filing, None)
        return
    text = "\n".join(part for _, part in read_lines(path))
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(path, exc.lineno, f"{json_problem(exc, text)} (sec reads {FORMS})") from None
    filings = document if isinstance(document, list) else [document]
    where = _KeyLines(text)
    for index, filing in enumerate(filings):
        if not isinstance(filing, dict):
            raise FormatError(path, None, f"item {index} of the JSON array is not an object (a filing); sec reads {FORMS}")
        yield from _filing_units(path, None, filing, where)


def _whole_json_line(text: str) -> bool:
    """Whether a line is a whole JSON object: the first filing of a JSONL file (an array on one line is a document)."""
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


class _KeyLines:
    """The line of each text field of a JSON document, found in document order (a filing's paragraphs are
    named by the line their field starts on, as a JSONL filing's are by its line)."""

    def __init__(self, text: str):
        self.text, self.cursor = text, 0

    def line_of(self, key: str) -> int:
        found = self.text.find(json.dumps(key), self.cursor)
        if found < 0:
            return 1
        self.cursor = found + 1
        return self.text.count("\n", 0, found) + 1


def _filing_units(path: Path, line: int | None, filing: dict[str, object],
                  where: _KeyLines | None) -> Iterator[tuple[str, str, int, str]]:
    """``(user, doc_id, line, paragraph)`` of one filing: its filer (CIK) is the user."""
    cik = _cik_of(filing)
    if cik is None:
        raise FormatError(path, line, f"a filing without a 'cik' field (the filer, who is the user); sec reads {FORMS}")
    sections = [k for k in filing if _SECTION.match(k)]
    if not sections:
        fields = ", ".join(sorted(filing)[:12]) or "none"
        raise FormatError(path, line, f"no 'section_*' or 'item*' text fields in this filing (its fields: {fields}); "
                          f"sec reads {FORMS}")
    doc_id = str(filing.get("filename") or filing.get("accession") or filing.get("accession_number")
                 or (f"{cik}-{filing['year']}" if filing.get("year") else path.name))
    for key in sections:
        at = line if where is None else where.line_of(key)
        for paragraph in _paragraphs_of(str(filing[key] or "")):
            yield f"cik:{cik}", doc_id, at if at is not None else 1, paragraph


def _cik_of(filing: dict[str, object]) -> str | None:
    """The filer's CIK without leading zeros; a crawler may write it as a number or a one-item list."""
    raw = filing.get("cik")
    if isinstance(raw, list) and len(raw) == 1:
        raw = raw[0]
    if raw is None or isinstance(raw, (dict, list)) or not str(raw).strip():
        return None
    text = str(raw).strip()
    return str(int(text)) if text.isdigit() else text


def edgar_submission_records(path: Path, document_types: tuple[str, ...] = ()) -> Iterator[SourceRecord]:
    """Records of a raw full-submission file; ``document_types`` empty means the submission's own type."""

    def units() -> Iterator[tuple[str, str, int, str]]:
        cik = submission_type = None
        in_header = in_text = False
        doc_type, text_line = "", 0
        buffer: list[str] = []
        accession = path.name
        for line, text in read_lines(path):
            if text.startswith("<SEC-HEADER>"):
                in_header = True
                continue
            if text.startswith("</SEC-HEADER>"):
                in_header = False
                if cik is None:
                    raise FormatError(path, line, "SEC header has no 'CENTRAL INDEX KEY'")
                continue
            if in_header:
                field = _HEADER_FIELD.match(text)
                if field and field.group(1) == "CENTRAL INDEX KEY" and cik is None:
                    cik = str(int(field.group(2))) if field.group(2).isdigit() else field.group(2)
                elif field and field.group(1) == "CONFORMED SUBMISSION TYPE":
                    submission_type = field.group(2)
                elif field and field.group(1) == "ACCESSION NUMBER":
                    accession = field.group(2)
                continue
            if text.startswith("<DOCUMENT>"):
                doc_type = ""
            elif text.startswith("<TYPE>") and not in_text:
                doc_type = text[len("<TYPE>"):].strip()
            elif text.startswith("<TEXT>"):
                if cik is None:
                    raise FormatError(path, line, "<TEXT> before an SEC header with 'CENTRAL INDEX KEY'")
                in_text, text_line, buffer = True, line, []
            elif text.startswith("</TEXT>"):
                if not in_text:
                    raise FormatError(path, line, "</TEXT> without <TEXT>")
                in_text = False
                wanted = document_types or ((submission_type,) if submission_type else ())
                if not wanted or doc_type in wanted:
                    for paragraph in _document_paragraphs(buffer):
                        yield f"cik:{cik}", f"{accession}/{doc_type}", text_line, paragraph
                buffer = []
            elif in_text:
                buffer.append(text)
        if in_text:
            raise FormatError(path, text_line, "<TEXT> is never closed by </TEXT> (truncated file?)")
        if cik is None:
            raise FormatError(path, None, f"no SEC header with 'CENTRAL INDEX KEY': not a full-submission file; sec reads {FORMS}")

    yield from _require_some(path, _sentences(path, units()))


def _document_paragraphs(lines: list[str]) -> list[str]:
    head = "\n".join(lines[:20]).lstrip()
    if head.startswith("begin ") or not head:  # uuencoded image, zip or PDF: no text
        return []
    body = "\n".join(lines)
    if re.search(r"<(html|body|p|div|table|font)\b", body[:5000], re.IGNORECASE):
        return html_paragraphs(body)
    return _paragraphs_of(re.sub(r"</?(PRE|PAGE|XBRL)>", "", body))


def _require_some(path: Path, records: Iterator[SourceRecord]) -> Iterator[SourceRecord]:
    produced = False
    for record in records:
        produced = True
        yield record
    if not produced:
        raise FormatError(path, None, "no text found (empty file, or no documents of the requested type?)")


def _read(path: Path, options: IngestOptions) -> Iterator[SourceRecord]:
    if looks_like_json(path) or _starts_like_json(path):
        return edgar_corpus_records(path)
    return edgar_submission_records(path, tuple(options.sec_document_types))


def _starts_like_json(path: Path) -> bool:
    """A filing saved without a .json name (``0000320193-23-000106``) is JSON when it starts like it."""
    for _, text in read_lines(path):
        if text.strip():
            return text.lstrip().startswith(("{", "["))
    return False


register_format(CorpusFormat(
    name="sec", summary="SEC filings as EDGAR-CORPUS JSONL, JSON documents or raw EDGAR submissions, one user per filer (CIK)",
    read=_read, default_users="filer", fixed_users=True,
    more_users="each filer (CIK) is one user: ingest filings of more filers",
    file_patterns=("*.jsonl", "*.json", "*.txt"),
))
