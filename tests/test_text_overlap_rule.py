"""The rule that says two texts share writers' sentences (``services.text_overlap``), at its boundaries.

tests/test_text_reuse.py runs the rule on real corpora (copies of part of a train split are caught, a
corpus written from the same templates is not). These pin the rule's parts where they flip: a sentence is
distinctive from five words, three shared sentences are needed and they must make half of the smaller
side, and sentence ids are keyed by the data home's secret, so an index says nothing outside its home.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from uedp.services.text_overlap import MIN_SHARE, MIN_SHARED, MIN_WORDS, distinctive, sentence_ids, shares_sentences
from uedp.storage.home import DataHome


def test_a_sentence_is_distinctive_from_five_words() -> None:
    assert MIN_WORDS == 5
    assert not distinctive("Year ended March 31")  # Reuters' boilerplate: four words
    assert distinctive("Year ended March 31 , 1987")
    assert not distinctive("- - - - - - - -")  # punctuation is no word
    assert not distinctive("REUTER") and not distinctive("")


def _index(*names: str) -> frozenset[str]:
    return frozenset(names)


def test_fewer_than_three_shared_sentences_never_count_however_small_the_sides() -> None:
    assert MIN_SHARED == 3
    assert not shares_sentences(_index("a", "b"), _index("a", "b"))  # all of both, but only two
    assert shares_sentences(_index("a", "b", "c"), _index("a", "b", "c"))


def test_the_shared_sentences_must_make_half_of_the_smaller_side() -> None:
    assert MIN_SHARE == 0.5
    split = _index(*(f"s{i}" for i in range(100)))
    half_copy = _index(*(f"s{i}" for i in range(50)))
    assert shares_sentences(split, half_copy)  # a copy of half the documents: the copy is the smaller side
    inside_a_large_text = half_copy | _index(*(f"other{i}" for i in range(1000)))
    assert shares_sentences(split, inside_a_large_text)  # the split is the smaller side: 50 of 100
    few_inside = _index("s1", "s2", "s3", "s4") | _index(*(f"other{i}" for i in range(1000)))
    assert not shares_sentences(split, few_inside)  # 4 of 100: boilerplate-sized, let through (documented)
    just_under = _index(*(f"s{i}" for i in range(49))) | _index(*(f"x{i}" for i in range(51)))
    assert not shares_sentences(split, just_under)  # 49 of the smaller side's 100


def test_the_rule_is_symmetric() -> None:
    left, right = _index("a", "b", "c", "d"), _index("c", "d", "e", "a", "f", "g")
    assert shares_sentences(left, right) == shares_sentences(right, left)


def test_sentence_ids_keep_distinctive_sentences_once_and_are_keyed_by_the_home(tmp_path: Path) -> None:
    first, second = DataHome.from_env(tmp_path / "one"), DataHome.from_env(tmp_path / "two")
    texts = ["The ferry to Dover left at seven .", "The ferry to Dover left at seven .", "Reuter", "",
             "Alice Smith owes the bank 300 pounds ."]
    ids = sentence_ids(first, texts)
    assert len(ids) == 2  # the repeat counted once, the short one and the empty one left out
    assert sentence_ids(first, reversed(texts)) == ids  # order does not matter
    assert sentence_ids(second, texts).isdisjoint(ids)  # another home's secret: nothing in common
    assert not any("Dover" in i or "Alice" in i for i in ids)  # hashes, not the sentences


@pytest.mark.parametrize("edit", [str.lower, lambda s: s.replace(" .", "."), lambda s: s + " Indeed ."])
def test_an_edited_sentence_is_another_sentence(tmp_path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """What the rule does not catch, as docs/PRIVACY.md says: copies whose sentences differ."""
    home = DataHome.from_env(tmp_path / "home")
    sentence = "The ferry to Dover left at seven ."
    assert sentence_ids(home, [sentence]).isdisjoint(sentence_ids(home, [edit(sentence)]))
