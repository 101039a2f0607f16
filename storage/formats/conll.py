"""CoNLL-2003 reader: ``token POS chunk NER`` lines, blank lines between sentences, ``-DOCSTART-``
between documents. Accepts the original IOB1 tags and the IOB2 tags of many copies (and BIOES),
decoding all of them to character spans over the sentence text (tokens joined by single spaces).

Streaming: one sentence in memory at a time, so a file of any size reads in bounded memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from uedp.storage.formats import FormatError, SourceRecord, read_lines, split_from_filename
from uedp.storage.formats.registry import CorpusFormat, register_format

if TYPE_CHECKING:
    from uedp.storage.ingest import IngestOptions

# The prefix is everything before the first hyphen: B-creative-work is B + creative-work (types may hold
# hyphens, as in WNUT-17's and Few-NERD's, but neither end with one nor hold two in a row).
_TAG = re.compile(r"^(?:O|[BIES]-[A-Za-z][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*)$")
# Chunk tags (CoNLL-2000 phrases): the last column of a file without NER tags, which must not become entities.
CHUNK_LABELS = frozenset({"NP", "VP", "PP", "ADVP", "ADJP", "SBAR", "PRT", "CONJP", "INTJ", "LST", "UCP"})


@dataclass
class ConllSentence:
    doc_index: int
    position: int  # sentence index within its document
    line: int  # 1-based line of the sentence's first token
    tokens: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(self.tokens)

    def spans(self) -> list[dict[str, object]]:
        """Entity spans as ``{start, end, label}`` character offsets into :attr:`text`."""
        spans: list[dict[str, object]] = []
        offset = 0
        current: dict[str, object] | None = None
        prev_label = None
        for token, tag in zip(self.tokens, self.tags):
            start, end = offset, offset + len(token)
            offset = end + 1
            if tag == "O":
                current, prev_label = None, None
                continue
            prefix, _, label = tag.partition("-")  # on the first hyphen only: B-creative-work
            # B and S always open a span; I and E open one unless they continue the same label
            # (this single rule decodes IOB1, IOB2 and BIOES).
            if prefix in "BS" or current is None or label != prev_label:
                current = {"start": start, "end": end, "label": label}
                spans.append(current)
            else:
                current["end"] = end
            prev_label = label
            if prefix in "ES":
                current, prev_label = None, None
        return spans


def read_conll(path: Path) -> Iterator[ConllSentence]:
    """Yield sentences of a CoNLL file; raise FormatError naming file and line on bad input."""
    doc_index, position, columns = 0, 0, None
    saw_docstart, produced = False, False
    sentence: ConllSentence | None = None
    for lineno, line in read_lines(path):
        if not line.strip():
            if sentence is not None:
                yield sentence
                produced, position, sentence = True, position + 1, None
            continue
        parts = line.split()
        if parts[0] == "-DOCSTART-":
            if sentence is not None:
                raise FormatError(path, lineno, "-DOCSTART- inside a sentence (expected a blank line before it)")
            if saw_docstart or produced:
                doc_index += 1
            saw_docstart, position = True, 0
            continue
        if columns is None:
            if len(parts) < 2:
                raise FormatError(path, lineno, f"expected 'token ... NER-tag' columns, got {len(parts)}")
            columns = len(parts)
        elif len(parts) != columns:
            raise FormatError(path, lineno, f"expected {columns} columns like the lines before, got {len(parts)}")
        tag = parts[-1]
        if not _TAG.match(tag):
            raise FormatError(path, lineno, f"unknown NER tag {tag!r} (expected O, B-X, I-X, E-X or S-X; the type X "
                                            "starts with a letter: letters, digits, '_', and single inner '-')")
        if tag[2:] in CHUNK_LABELS:
            raise FormatError(path, lineno, f"the last column holds chunk tags ({tag!r}), not NER tags: this file has "
                                            f"no entity annotation (CoNLL-2003 lines are 'token POS chunk NER')")
        if sentence is None:
            sentence = ConllSentence(doc_index=doc_index, position=position, line=lineno)
        sentence.tokens.append(parts[0])
        sentence.tags.append(tag)
    if sentence is not None:
        yield sentence
        produced = True
    if not produced:
        raise FormatError(path, None, "no sentences found (empty file?)")


def conll_records(path: Path) -> Iterator[SourceRecord]:
    """CoNLL-2003 as source records: one document (``-DOCSTART-``) is one user, gold spans kept."""
    split = split_from_filename(path)
    for sent in read_conll(path):
        user = f"{path.name}#{sent.doc_index:05d}"
        yield SourceRecord(text=sent.text, user=user, doc_id=user, line=sent.line, split=split,
                           gold_spans=sent.spans())


def _read(path: Path, options: IngestOptions) -> Iterator[SourceRecord]:
    return conll_records(path)


register_format(CorpusFormat(
    name="conll2003", summary="CoNLL-2003 NER files, one user per document, with gold entity tags",
    read=_read, default_users="document", fixed_users=True, gold=True,
    more_users="each -DOCSTART- document is one user, so a file without -DOCSTART- lines is a single user: mark "
               "its documents, or convert it to JSON lines and ingest that with `uedp ingest jsonl FILE --text-col text "
               "--users chunk:N`",
    file_patterns=("eng.*", "*.conll"),
))
