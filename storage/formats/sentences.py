"""Rule-based sentence splitting with spaCy's ``sentencizer`` (no trained pipeline needed).

Used for formats whose units are paragraphs or whole documents (SEC filings, WikiText).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spacy.language import Language

WINDOW = 100_000  # longer paragraphs are cut at whitespace into windows: spaCy's cost grows with length


@lru_cache(maxsize=1)
def sentencizer() -> Language:
    import spacy  # here, not at import: the format registry loads every reader, and most never split sentences

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.max_length = 2 * WINDOW
    return nlp


def _windows(text: str) -> Iterator[str]:
    while len(text) > WINDOW:
        cut = text.rfind(". ", 0, WINDOW) + 1 or text.rfind(" ", 0, WINDOW)  # prefer a sentence end
        cut = cut if cut > 0 else WINDOW
        yield text[:cut]
        text = text[cut:]
    yield text


def split_sentences(paragraphs: Iterable[str], batch_size: int = 256) -> Iterator[list[str]]:
    """For each input paragraph, its sentences (stripped, non-empty), in order; one list per paragraph."""
    nlp = sentencizer()
    pieces = ((window, index) for index, paragraph in enumerate(paragraphs) for window in _windows(paragraph))
    current, seen = 0, False
    sentences: list[str] = []
    for doc, index in nlp.pipe(pieces, as_tuples=True, batch_size=batch_size):
        seen = True
        while index > current:  # paragraphs are consecutive; an empty one still yields its (empty) list
            yield sentences
            current, sentences = current + 1, []
        sentences.extend(s.text.strip() for s in doc.sents if s.text.strip())
    if seen:
        yield sentences
