"""Sentence splitting for paragraph and document formats (``storage.formats.sentences``), on its own.

SEC filings and WikiText arrive as paragraphs; their sentences become a dataset's rows, and each row keeps
its paragraph's writer. So the splitter must give one list per paragraph, in order, with empty paragraphs
kept in place (a shifted list would hand sentences to the wrong writer), and must cut a paragraph longer
than spaCy's window without losing or doubling a character.
"""

from __future__ import annotations

import pytest

from uedp.storage.formats import sentences
from uedp.storage.formats.sentences import split_sentences


def test_one_list_per_paragraph_in_order_with_empty_paragraphs_kept_in_place() -> None:
    paragraphs = ["The ferry left at dawn. It reached Dover by noon.", "", "   ", "One more sentence here."]
    split = list(split_sentences(paragraphs))
    assert split == [["The ferry left at dawn.", "It reached Dover by noon."], [], [], ["One more sentence here."]]


def test_no_paragraphs_give_no_lists() -> None:
    assert list(split_sentences([])) == []


def test_trailing_empty_paragraphs_still_get_their_lists() -> None:
    """Every paragraph yields exactly one list, so a caller can zip them with the paragraphs' writers."""
    split = list(split_sentences(["First one. Second one.", "", ""]))
    assert split == [["First one.", "Second one."], [], []]


def test_sentences_are_stripped_and_none_is_empty() -> None:
    (split,) = split_sentences(["  Leading space.   Trailing space.  \n\n Next line?  "])
    assert split == ["Leading space.", "Trailing space.", "Next line?"]
    assert all(s and s == s.strip() for s in split)


def test_a_paragraph_longer_than_the_window_is_cut_at_a_sentence_end_and_loses_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sentences.sentencizer()  # built (and cached) at the real window first: a pipeline capped at 120 characters
    monkeypatch.setattr(sentences, "WINDOW", 60)  # must not outlive this test in the worker's cache
    text = " ".join(f"Sentence number {i} ends here." for i in range(12))
    windows = list(sentences._windows(text))
    assert len(windows) > 1 and "".join(windows) == text
    assert all(len(w) <= 60 for w in windows)
    assert all(w.rstrip().endswith(".") for w in windows[:-1])  # the cut falls after a full stop
    (split,) = split_sentences([text])
    assert split == [f"Sentence number {i} ends here." for i in range(12)]


def test_a_window_without_a_sentence_end_is_cut_at_whitespace_then_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sentences, "WINDOW", 10)
    words = "alpha beta gamma delta epsilon"
    assert "".join(sentences._windows(words)) == words
    assert all(len(w) <= 10 for w in sentences._windows(words))
    unbroken = "x" * 25
    assert list(sentences._windows(unbroken)) == ["x" * 10, "x" * 10, "x" * 5]


def test_the_sentencizer_is_built_once_and_blank() -> None:
    nlp = sentences.sentencizer()
    assert nlp is sentences.sentencizer() and nlp.pipe_names == ["sentencizer"]
    assert nlp.max_length >= sentences.WINDOW
