"""A dataset's text key (storage/text_identity.py) answers whether two datasets hold the same text, whatever their
names, splits and users: lineage and the privacy ledger rest on it (a run on a copy of a dataset is charged to
the same text). It must be blind to order and to everything but the sentences, count repeated sentences, and
move with one changed character; a table an older uedp wrote, without a recorded key, gets the same key from its
rows."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from uedp.storage.tables import DATA_FILE, MANIFEST_FILE
from uedp.storage.text_identity import TEXT_KEY, sentence_digest, table_text_key, text_key, text_key_of

TEXTS = ["Peter Okafor joined Lloyds .", "The bank said so .", "Rain in Leeds ."]


def write_table(folder: Path, texts: list[str], manifest: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": texts, "split": ["train"] * len(texts)}), folder / DATA_FILE)
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest), encoding="utf-8")
    return folder


def test_the_text_key_is_blind_to_order_and_counts_repeats() -> None:
    key = text_key_of(TEXTS)
    assert text_key_of(reversed(TEXTS)) == key
    assert text_key_of([*TEXTS, TEXTS[0]]) != key  # a multiset: a repeated sentence is more text
    assert text_key_of(TEXTS[:2]) != key
    assert text_key_of([TEXTS[0], TEXTS[1], "Rain in Leeds!"]) != key  # one character
    assert text_key(sentence_digest(t) for t in TEXTS) == key and len(key) == 64


def test_sentence_boundaries_are_part_of_the_text() -> None:
    assert text_key_of(["a b", "c"]) != text_key_of(["a", "b c"])
    assert text_key_of([]) == text_key_of([]) != text_key_of([""])


def test_a_tables_key_is_the_recorded_one_or_computed_from_its_rows(tmp_path: Path) -> None:
    recorded = write_table(tmp_path / "new", TEXTS, {"key": "k1", TEXT_KEY: "recorded-key"})
    assert table_text_key(recorded) == "recorded-key"  # read, not recomputed
    older = write_table(tmp_path / "older", list(reversed(TEXTS)), {"key": "k2", "created": "2026-01-01"})
    assert table_text_key(older) == text_key_of(TEXTS)
    assert table_text_key(tmp_path / "absent") == ""


def test_an_older_table_written_again_is_read_again(tmp_path: Path) -> None:
    folder = write_table(tmp_path / "older", TEXTS, {"key": "k", "created": "2026-01-01T00:00:00"})
    first = table_text_key(folder)
    write_table(folder, TEXTS[:2], {"key": "k", "created": "2026-01-02T00:00:00"})  # rewritten: another identity
    assert table_text_key(folder) == text_key_of(TEXTS[:2]) != first
