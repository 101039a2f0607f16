"""WikiText-2/103, token (``wiki.train.tokens``) and raw (``wiki.train.raw``, ``train.txt``) files.

Articles start at top-level headings (`` = Title = ``); subsection headings (`` = = Gameplay = = ``)
stay inside their article. One article is one user. Paragraph lines are split into sentences with
spaCy's sentencizer. ``<unk>`` and the ``@-@``, ``@,@``, ``@.@`` conventions are kept unless
``detokenize`` is set, which also undoes the tokenised spacing around punctuation.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from uedp.storage.formats import FormatError, SourceRecord, read_lines, split_from_filename
from uedp.storage.formats.registry import CorpusFormat, register_format
from uedp.storage.formats.sentences import split_sentences

if TYPE_CHECKING:
    from uedp.storage.ingest import IngestOptions

_TOP_HEADING = re.compile(r"^ ?= (?!=)(.+?) = ?$")
_ANY_HEADING = re.compile(r"^ ?(=+) .+ \1 ?$")
_DETOKENIZE = [
    (re.compile(r" @(-|,|\.)@ "), r"\1"),
    (re.compile(r" ([.,;:!?%)\]}])"), r"\1"),
    (re.compile(r"([(\[{$]) "), r"\1"),
    (re.compile(r" (n't|'s|'re|'ve|'m|'ll|'d)\b"), r"\1"),
    (re.compile(r'" (.*?) "'), r'"\1"'),
]


def detokenize(text: str) -> str:
    for pattern, replacement in _DETOKENIZE:
        text = pattern.sub(replacement, text)
    return text


def _paragraphs(path: Path) -> Iterator[tuple[int, int, str]]:
    """``(article index, line, paragraph)`` for every paragraph line, in order."""
    article = -1
    for lineno, line in read_lines(path):
        if not line.strip():
            continue
        if _TOP_HEADING.match(line):
            article += 1
            continue
        if _ANY_HEADING.match(line):
            continue
        if article < 0:
            raise FormatError(path, lineno, "text before the first ' = Title = ' heading (is this a WikiText file?)")
        yield article, lineno, line.strip()


def wikitext_articles(path: Path) -> list[list[str]]:
    """The file's articles, each its lines (newline kept) from its `` = Title = `` heading up to the next
    one, so that the first N articles can be copied as a smaller corpus in the same format (blank lines
    before the first heading go with the first article). A file without a heading is an error naming it."""
    articles: list[list[str]] = []
    preamble: list[str] = []
    for lineno, line in read_lines(path):
        if _TOP_HEADING.match(line):
            articles.append([*preamble, line + "\n"])
            preamble = []
        elif articles:
            articles[-1].append(line + "\n")
        elif line.strip():
            raise FormatError(path, lineno, "text before the first ' = Title = ' heading (is this a WikiText file?)")
        else:
            preamble.append(line + "\n")
    if not articles:
        raise FormatError(path, None, "no ' = Title = ' heading found (empty file?)")
    return articles


def wikitext_records(path: Path, detokenized: bool = False) -> Iterator[SourceRecord]:
    split = split_from_filename(path)
    pending: deque[tuple[int, int]] = deque()  # (article, line) of paragraphs handed to spaCy, in order

    def texts() -> Iterator[str]:
        for article, lineno, paragraph in _paragraphs(path):
            pending.append((article, lineno))
            yield detokenize(paragraph) if detokenized else paragraph

    produced = False
    for sentences in split_sentences(texts()):
        article, lineno = pending.popleft()
        user = f"{path.name}#{article:06d}"
        for sentence in sentences:
            produced = True
            yield SourceRecord(text=sentence, user=user, doc_id=user, line=lineno, split=split)
    if not produced:
        raise FormatError(path, None, "no article text found (empty file?)")


def _read(path: Path, options: IngestOptions) -> Iterator[SourceRecord]:
    return wikitext_records(path, options.detokenize)


register_format(CorpusFormat(
    name="wikitext", summary="WikiText-2/103 token or raw files, one user per article",
    read=_read, default_users="article", fixed_users=True,
    more_users="each article is one user: ingest more articles",
    file_patterns=("wiki.*.tokens", "wiki.*.raw", "train.txt", "valid.txt", "test.txt"),
))
