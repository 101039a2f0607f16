"""Atomic tables, idempotent ingest, gold detection and the DuckDB catalog on real Parquet files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from uedp.flows.demo import DEMO_CORPUS
from uedp.services.detect import detect_entities
from uedp.storage.catalog import Catalog
from uedp.storage.formats import FormatError
from uedp.storage.ingest import conll_options, ingest
from uedp.storage.schemas import USERS
from uedp.storage.tables import TableWriter, read_manifest, read_table

from support import write


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def test_failed_write_leaves_previous_table_and_no_temporary_files(tmp_path: Path) -> None:
    table_dir = tmp_path / "ds" / "users"
    row = {"user_id": "a", "n_sentences": 1, "n_train": 1, "n_valid": 0, "n_test": 0}
    with TableWriter(table_dir, USERS, key="k1") as writer:
        writer.write_rows([row])
    with pytest.raises(RuntimeError), TableWriter(table_dir, USERS, key="k2") as writer:
        writer.write_rows([row | {"user_id": "b"}])
        raise RuntimeError("crash mid-write")
    assert read_manifest(table_dir)["key"] == "k1"
    assert read_table(table_dir).column("user_id").to_pylist() == ["a"]
    assert _leftovers(table_dir.parent) == []


def test_ingest_is_idempotent_and_rebuilds_on_changed_input(home, tmp_path: Path) -> None:
    corpus = tmp_path / "demo.conll"
    shutil.copy(DEMO_CORPUS, corpus)
    first = ingest(home, "demo", [corpus], conll_options(split_seed=0))
    assert not first.reused and first.users == 40 and first.sentences > 500
    again = ingest(home, "demo", [corpus], conll_options(split_seed=0))
    assert again.reused and again.sentences == first.sentences
    with open(corpus, "a", encoding="utf-8") as handle:
        handle.write("\n-DOCSTART- -X- -X- O\n\nHello XX O O\n")
    changed = ingest(home, "demo", [corpus], conll_options(split_seed=0))
    assert not changed.reused and changed.users == 41


def test_bad_input_leaves_previous_tables_untouched(home, tmp_path: Path) -> None:
    good = shutil.copy(DEMO_CORPUS, tmp_path / "demo.conll")
    ingest(home, "demo", [Path(good)], conll_options())
    before = read_manifest(home.table_dir("demo", "sentences"))
    bad = write(tmp_path / "bad.conll", Path(good).read_text() + "\nbroken line with five cols O\n")
    with pytest.raises(FormatError, match=r"bad.conll:\d+: expected 4 columns"):
        ingest(home, "demo", [bad], conll_options())
    assert read_manifest(home.table_dir("demo", "sentences")) == before
    assert _leftovers(home.dataset_dir("demo")) == []


def test_split_by_user_never_splits_a_user(home) -> None:
    ingest(home, "demo", [DEMO_CORPUS], conll_options(split_seed=3))
    with Catalog(home, "demo") as catalog:
        per_user = catalog.con.execute("SELECT user_id, count(DISTINCT split) FROM sentences GROUP BY user_id").fetchall()
        splits = {s for (s,) in catalog.con.execute("SELECT DISTINCT split FROM sentences").fetchall()}
    assert all(n == 1 for _, n in per_user)
    assert splits == {"train", "valid", "test"}


def test_gold_detection_is_cached_and_categories_are_a_query(home) -> None:
    ingest(home, "demo", [DEMO_CORPUS], conll_options())
    first = detect_entities(home, "demo")
    assert not first.reused and first.entities > 500
    assert detect_entities(home, "demo").reused
    with Catalog(home, "demo") as catalog:
        counts = {c.category: c for c in catalog.category_counts(["PERSON", "PHONE_NUMBER"])}
        assert set(counts) == {"PERSON", "PHONE_NUMBER"}
        # the shared clinic doctor links many users: the UeDP unit
        shared = catalog.con.execute(
            "SELECT max(n) FROM (SELECT count(DISTINCT user_id) n FROM entities WHERE category='PERSON' GROUP BY entity_key)"
        ).fetchone()[0]
        assert shared >= 10
        spans = catalog.entity_spans(["PHONE_NUMBER"], "train")
        sentence_id, found = next(iter(spans.items()))
        text = catalog.con.execute("SELECT text FROM sentences WHERE sentence_id = ?", [sentence_id]).fetchone()[0]
        start, end, category, key = found[0]
        assert category == "PHONE_NUMBER" and text[start:end].startswith("+44") and key.startswith("+44")
    assert pa.types.is_string(read_table(home.table_dir("demo", "entities")).schema.field("entity_key").type)
