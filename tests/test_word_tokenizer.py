"""The word-level tokenizer (models/tokenization.py): its vocabulary can never hold a number (digits are
always the single-digit tokens 0-9, which are always in it), unknown words and WikiText's literal
``<unk>`` are the unknown token, it survives ``save_pretrained`` / ``load_tokenizer`` unchanged, and a run
names its folder (``tokenizer=FOLDER``) to train the LSTM with it: recurrent selective then states one
token, not one byte, as its unit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from uedp.models.tokenization import (
    DIGITS,
    EOS,
    UNK,
    WORD_LIST_FILE,
    load_tokenizer,
    most_frequent_words,
    save_word_level_tokenizer,
    word_level_tokenizer,
)

PUBLIC = ["The station opened in 1990 with 12 @,@ 500 seats .", "My ID is 341752 , the 2nd of 3 .",
          "The old station closed in 2001 .", "It was the 1990s ; the station had <unk> trains ."]


def test_digits_are_always_single_tokens_and_never_a_vocabulary_entry() -> None:
    words = most_frequent_words(PUBLIC, 100)
    assert not any(ch.isdigit() for word in words for ch in word)  # 1990, 341752, 2nd, 1990s: not entries
    assert "nd" in words and "s" in words and "@,@" in words and UNK not in words
    tokenizer = word_level_tokenizer(words)
    vocabulary = tokenizer.get_vocab()
    assert all(digit in vocabulary for digit in DIGITS)
    assert sorted(entry for entry in vocabulary if any(ch.isdigit() for ch in entry)) == list(DIGITS)
    assert tokenizer.tokenize("My ID is 341752 .") == ["My", "ID", "is", "3", "4", "1", "7", "5", "2", "."]
    # a number never seen in the word list's source is still its digits, never <unk>
    assert tokenizer.tokenize("90210") == ["9", "0", "2", "1", "0"]
    for entry in ("1990", "abc1", "two words", "", "x²"):
        with pytest.raises(ValueError, match="no digit and no whitespace"):
            word_level_tokenizer(["station", entry])


def test_unknown_words_and_wikitexts_unk_are_the_unknown_token() -> None:
    tokenizer = word_level_tokenizer(most_frequent_words(PUBLIC, 100))
    encoded = tokenizer("The zeppelin had <unk> trains", add_special_tokens=False, return_offsets_mapping=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert tokens == ["The", UNK, "had", UNK, "trains"]
    assert encoded["offset_mapping"][1] == (4, 12) and encoded["offset_mapping"][3] == (17, 22)
    assert tokenizer.unk_token_id == tokenizer.get_vocab()[UNK]
    assert tokenizer.eos_token == EOS and tokenizer.pad_token_id == tokenizer.eos_token_id != tokenizer.unk_token_id


def test_the_word_list_keeps_the_most_frequent_words() -> None:
    words = most_frequent_words(["b a a c a b"] * 3 + ["d"], 2)
    assert words == ["a", "b"]
    assert len(word_level_tokenizer(words)) == 2 + len(DIGITS) + 2  # <unk>, EOS, the digits, the words
    with pytest.raises(ValueError, match="at least one word"):
        most_frequent_words(["a"], 0)


def test_saved_tokenizer_loads_back_unchanged(tmp_path: Path) -> None:
    words = most_frequent_words(PUBLIC, 100)
    tokenizer = word_level_tokenizer(words)
    folder = save_word_level_tokenizer(words, tmp_path / "words", "the test's public sentences")
    loaded = load_tokenizer(folder)
    text = "The old station had 341752 <unk> seats and a zeppelin ."
    assert loaded(text, add_special_tokens=False)["input_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert loaded.get_vocab() == tokenizer.get_vocab() and len(loaded) == len(tokenizer)
    assert (loaded.eos_token_id, loaded.pad_token_id, loaded.unk_token_id) == \
        (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id)
    assert json.loads((folder / WORD_LIST_FILE).read_text(encoding="utf-8")) == {
        "source": "the test's public sentences", "words": len(words)}


def test_an_lstm_trains_with_the_folder_and_selective_states_one_token_as_its_unit(home, tmp_path: Path) -> None:
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.privacy.mechanisms.selective_recurrent import TOKEN_UNIT
    from uedp.services.config import TrainConfig
    from uedp.services.detect import detect_entities
    from uedp.services.training import train_configuration
    from uedp.storage.catalog import Catalog
    from uedp.storage.ingest import IngestOptions, ingest

    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    with Catalog(home, "demo") as catalog:  # the word list from the held-out splits: no run trains on them
        public = [text for split in ("valid", "test") for _, _, text in catalog.sentences(split)]
    folder = save_word_level_tokenizer(most_frequent_words(public, 300), tmp_path / "demo-words", "demo valid+test")
    tokenizer = load_tokenizer(folder)
    vocabulary = len(tokenizer)
    ids = [i for row in tokenizer(public, add_special_tokens=False)["input_ids"] for i in row]
    assert ids.count(tokenizer.unk_token_id) < 0.2 * len(ids)  # a perplexity over words, not over <unk>

    noiseless = TrainConfig(dataset="demo", mechanism="noiseless", model="lstm", tokenizer=str(folder), steps=40,
                            lr=1e-2, checkpoint_every=0)
    trained = train_configuration(home, noiseless, progress=False)
    assert trained.utility_test < vocabulary / 4  # far better than a uniform guess over the vocabulary

    selective = TrainConfig(dataset="demo", mechanism="selective", model="lstm", tokenizer=str(folder),
                            categories=["PER"], steps=2, checkpoint_every=0)
    assert not selective.shape.byte_tokens
    result = train_configuration(home, selective, progress=False)
    assert 0 < result.epsilon < math.inf and result.unit == TOKEN_UNIT
    assert not any("byte" in caveat for caveat in result.caveats)


def test_a_pattern_split_keeps_each_sanitizer_word_one_token_in_lower_case() -> None:
    """The local-DP pages' split: every word a release can hold (the sanitizers' words, ``<unk>``) is one
    token of the vocabulary, in lower case, and numbers may be entries (no digit policy there)."""
    from uedp.models.tokenization import UNK, WordSplit
    from uedp.privacy.sanitization.embeddings import WORD

    split = WordSplit(pattern=f"{UNK}|{WORD.pattern}", lowercase=True, digits_alone=False)
    tokenizer = word_level_tokenizer(["the", "film's", "90-minute", "runtime", ","], split)
    assert tokenizer.tokenize("The FILM's 90-minute <unk> runtime,") == \
        ["the", "film's", "90-minute", UNK, "runtime", ","]
    assert tokenizer.convert_tokens_to_ids(tokenizer.tokenize("unseen"))[0] == tokenizer.unk_token_id
    assert "0" not in tokenizer.get_vocab()  # no digits added where digits are not split off
    with pytest.raises(ValueError, match="no whitespace"):
        word_level_tokenizer(["two words"], split)
