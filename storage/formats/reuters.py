"""Reuters-21578 (Distribution 1.0): 22 SGML files (``reut2-000.sgm`` ... ``reut2-021.sgm``) of
``<REUTERS>`` elements, each a 1987 newswire article.

* **Text**: the article's ``<TITLE>`` (its first unit) and ``<BODY>``, split into sentences with spaCy's
  sentencizer; the ``Reuter`` sign-off and the control characters of the wire are dropped. An article of
  ``TYPE="UNPROC"`` has no title or body markup: its whole ``<TEXT>`` is the body.
* **Users**: the article's ``<AUTHOR>`` where it has one (875 of 21,578 articles; ``by Janie Gabbett,
  Reuters`` is the writer ``Janie Gabbett``), otherwise the article itself (``article:<NEWID>``): the
  wire names no other writer. ``--users chunk:N`` groups N consecutive articles' sentences instead.
* **Split**: the official ``LEWISSPLIT`` attribute: ``TRAIN`` is train, ``TEST`` is test, and the 722
  ``NOT-USED`` articles (in neither of Lewis' sets) are valid.
* **Metadata**: ``DATE``, ``TOPICS``, ``PLACES``, ``PEOPLE``, ``ORGS``, ``EXCHANGES`` and ``COMPANIES``
  are kept per article (:attr:`SourceRecord.doc_tags`); ingest writes them beside the sentences as
  ``documents.parquet`` (``doc_id, tag, value``), so ``places = 'usa'`` is one DuckDB filter away.

The files are ASCII with a few Latin-1 bytes (``reut2-017.sgm``); a line that is not UTF-8 is read as
Latin-1, the distribution's own encoding. A malformed file is named by file and line.
"""

from __future__ import annotations

import html
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from uedp.errors import UedpError
from uedp.storage.formats import FormatError, SourceRecord, open_binary
from uedp.storage.formats.registry import CorpusFormat, register_format
from uedp.storage.formats.sentences import split_sentences

if TYPE_CHECKING:
    from uedp.storage.ingest import IngestOptions

SPLITS = {"TRAIN": "train", "TEST": "test", "NOT-USED": "valid"}
TAG_FIELDS = ("topics", "places", "people", "orgs", "exchanges", "companies")
_OPEN = re.compile(r"<REUTERS\b([^>]*)>")
_ATTRIBUTE = re.compile(r'([A-Z]+)="([^"]*)"')
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SIGN_OFF = re.compile(r"\s*\bReut(?:er|ers)?\s*$")
_SPACES = re.compile(r"\s+")
_AUTHOR = re.compile(r"^\s*by\s+(.+?)(?:\s*,\s*Reuters?)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Article:
    """One ``<REUTERS>`` element, as read."""

    new_id: str
    split: str
    line: int  # where its <REUTERS> tag is
    title: str
    body: list[str]  # paragraphs
    author: str | None
    tags: dict[str, list[str]]


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with open_binary(path) as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("latin-1")  # the distribution's own encoding (one file has a few such bytes)
            yield lineno, text.rstrip("\r\n")


def _element(block: str, tag: str) -> str | None:
    match = re.search(rf"<{tag}\b[^>]*>(.*?)</{tag}>", block, re.DOTALL)
    return match.group(1) if match else None


def _clean(text: str) -> str:
    return _CONTROL.sub(" ", html.unescape(text))


def _paragraphs(body: str) -> list[str]:
    """Wire paragraphs start on an indented line; the sign-off (``Reuter``) ends the last one."""
    chunks = re.split(r"\n(?=[ \t]{2,}\S)", _clean(body).strip())
    paragraphs = [_SPACES.sub(" ", chunk).strip() for chunk in chunks]
    if paragraphs:
        paragraphs[-1] = _SIGN_OFF.sub("", paragraphs[-1]).strip()
    return [p for p in paragraphs if p]


def writer_of(author: str) -> str | None:
    """``by Janie Gabbett, Reuters`` -> ``Janie Gabbett`` (spacing normalised)."""
    text = _SPACES.sub(" ", _clean(author)).strip()
    match = _AUTHOR.match(text)
    name = (match.group(1) if match else text).strip(" ,")
    return name or None


def _article(path: Path, line: int, attributes: str, block: str) -> Article:
    attrs = dict(_ATTRIBUTE.findall(attributes))
    for name in ("NEWID", "LEWISSPLIT"):
        if name not in attrs:
            raise FormatError(path, line, f"<REUTERS> without its {name} attribute")
    if attrs["LEWISSPLIT"] not in SPLITS:
        raise FormatError(path, line, f"LEWISSPLIT={attrs['LEWISSPLIT']!r}; expected one of {', '.join(SPLITS)}")
    text = _element(block, "TEXT")
    if text is None:
        raise FormatError(path, line, f"article NEWID={attrs['NEWID']} has no <TEXT>...</TEXT>")
    title, body = _element(text, "TITLE"), _element(text, "BODY")
    if title is None and body is None and not re.search(r"<(TITLE|BODY|AUTHOR|DATELINE)\b", text):
        body = text  # TYPE="UNPROC": the text is unmarked
    tags = {name: [_clean(d).strip() for d in re.findall(r"<D>(.*?)</D>", _element(block, name.upper()) or "")]
            for name in TAG_FIELDS}
    date = _element(block, "DATE")
    if date is not None:
        tags["date"] = [_clean(date).strip()]
    author = _element(text, "AUTHOR")
    return Article(attrs["NEWID"], SPLITS[attrs["LEWISSPLIT"]], line,
                   _SPACES.sub(" ", _clean(title or "")).strip(), _paragraphs(body or ""),
                   writer_of(author) if author else None, {k: v for k, v in tags.items() if v})


def reuters_articles(path: Path) -> Iterator[Article]:
    """The file's articles in order; a ``<REUTERS>`` opened inside another, a ``</REUTERS>`` without one, or
    a file that ends inside one is an error naming its line."""
    start: tuple[int, str] | None = None
    lines: list[str] = []
    produced = False
    for lineno, text in _lines(path):
        opened = _OPEN.search(text)
        if opened:
            if start is not None:
                raise FormatError(path, lineno, f"<REUTERS> opened before the one of line {start[0]} was closed")
            start, lines = (lineno, opened.group(1)), [text[opened.end():]]
        elif start is not None:
            lines.append(text)
        elif "</REUTERS>" in text:
            raise FormatError(path, lineno, "</REUTERS> without an opening <REUTERS>")
        if start is not None and "</REUTERS>" in text:
            block = "\n".join(lines)
            yield _article(path, start[0], start[1], block[:block.rindex("</REUTERS>")])
            produced, start = True, None
    if start is not None:
        raise FormatError(path, start[0], "<REUTERS> is never closed by </REUTERS> (truncated file?)")
    if not produced:
        raise FormatError(path, None, "no <REUTERS> articles found (is this a Reuters-21578 .sgm file?)")


def reuters_records(path: Path) -> Iterator[SourceRecord]:
    """Sentence records of a Reuters-21578 file: the title first, then each body paragraph's sentences."""
    pending: deque[tuple[Article, bool]] = deque()  # (article, whether this paragraph is its last)

    def texts() -> Iterator[str]:
        for article in reuters_articles(path):
            paragraphs = [article.title, *article.body] if article.title else article.body
            for index, paragraph in enumerate(paragraphs):
                pending.append((article, index == len(paragraphs) - 1))
                yield paragraph

    produced = False
    units: list[str] = []
    for sentences in split_sentences(texts()):
        article, last = pending.popleft()
        units.extend(sentences)
        if not last:
            continue
        user = f"author:{article.author}" if article.author else f"article:{article.new_id}"
        for index, sentence in enumerate(units):
            produced = True
            yield SourceRecord(text=sentence, user=user, doc_id=f"reuters:{article.new_id}", line=article.line,
                               split=article.split, doc_tags=article.tags if index == 0 else {})
        units = []
    if not produced:
        raise FormatError(path, None, "no article text found (every article empty?)")


def _read(path: Path, options: IngestOptions) -> Iterator[SourceRecord]:
    return reuters_records(path)


def _check(options: IngestOptions) -> None:
    strategy = options.user_strategy
    if not (strategy == "author" or strategy.startswith("chunk:")):
        raise UedpError("reuters21578 users: 'author' (the article's <AUTHOR>, else the article) or 'chunk:N' "
                        "(pseudo-users of N consecutive sentences)")


register_format(CorpusFormat(
    name="reuters21578", summary="Reuters-21578 SGML (reut2-*.sgm), users by <AUTHOR> else article, LEWISSPLIT",
    read=_read, default_users="author", check=_check,
    file_patterns=("reut2-*.sgm",),
))
