"""`ingest` across formats: user strategies, splits, content keys, atomicity, and the real CoNLL files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from uedp.errors import UedpError
from uedp.storage.catalog import Catalog
from uedp.storage.formats import FormatError
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.tables import read_manifest

from support import AG_CSV, WIKI, write


def _query(home, dataset: str, sql: str) -> list[tuple]:
    with Catalog(home, dataset) as catalog:
        return catalog.con.execute(sql).fetchall()


def test_real_conll2003_ingest_counts_users_per_document(home, shared_conll: Path) -> None:
    result = ingest(home, "conll", [shared_conll / n for n in ("eng.train", "eng.testa", "eng.testb")],
                    IngestOptions(format="conll2003"))
    assert result.per_split == {"train": 14041, "valid": 3250, "test": 3453}
    assert _query(home, "conll", "SELECT count(*) FROM users WHERE n_train > 0") == [(946,)]
    assert _query(home, "conll", "SELECT count(*) FROM sentences WHERE len(gold_spans) > 0 AND split='train'")[0][0] > 10_000


def test_ag_news_users_by_source_or_chunk_and_labels_kept(home, tmp_path: Path) -> None:
    train = write(tmp_path / "train.csv", AG_CSV)
    test = write(tmp_path / "test.csv", AG_CSV.splitlines()[0] + "\n")
    by_source = ingest(home, "ag", [train, test], IngestOptions(format="ag_news", users="source"))
    assert by_source.per_split == {"train": 5, "valid": 0, "test": 1}
    assert _query(home, "ag", "SELECT user_id, n_sentences FROM users ORDER BY user_id") == [
        ("source:AFP", 1), ("source:AP", 1), ("source:Reuters", 2), ("source:SPACE.com", 1), ("source:unknown", 1)]
    assert _query(home, "ag", "SELECT label, count(*) FROM sentences GROUP BY label ORDER BY label") == [
        ("1", 1), ("2", 1), ("3", 3), ("4", 1)]
    by_chunk = ingest(home, "ag", [train, test], IngestOptions(format="ag_news", users="chunk:2"))
    assert not by_chunk.reused  # other options, other content key: rebuilt
    assert _query(home, "ag", "SELECT user_id FROM users ORDER BY user_id") == [
        ("test.csv#chunk0000000",), ("train.csv#chunk0000000",), ("train.csv#chunk0000001",), ("train.csv#chunk0000002",)]
    assert read_manifest(home.table_dir("ag", "sentences"))["source"]["options"]["users"] == "chunk:2"


def test_wikitext_split_by_user_keeps_articles_whole(home, tmp_path: Path) -> None:
    path = write(tmp_path / "articles.tokens", WIKI * 20)
    result = ingest(home, "wiki", [path], IngestOptions(format="wikitext", split_seed=1, valid_fraction=0.3, test_fraction=0.3))
    assert result.users == 40
    assert _query(home, "wiki", "SELECT max(n) FROM (SELECT count(DISTINCT split) n FROM sentences GROUP BY user_id)") == [(1,)]
    assert {s for (s,) in _query(home, "wiki", "SELECT DISTINCT split FROM sentences")} == {"train", "valid", "test"}


def test_a_bad_second_file_leaves_the_previous_tables(home, tmp_path: Path) -> None:
    rows = [{"text": f"note {i}", "user": f"u{i % 3}"} for i in range(9)]
    good = write(tmp_path / "a.jsonl", "\n".join(json.dumps(r) for r in rows))
    options = IngestOptions(format="jsonl", text_col="text", user_col="user")
    ingest(home, "notes", [good], options)
    before = read_manifest(home.table_dir("notes", "sentences"))
    bad = write(tmp_path / "b.jsonl", json.dumps(rows[0]) + "\n" + '{"text": "x"}\n')
    with pytest.raises(FormatError, match=r"b\.jsonl:2: missing column 'user'"):
        ingest(home, "notes", [good, bad], options)
    assert read_manifest(home.table_dir("notes", "sentences")) == before
    assert {p.name for p in home.dataset_dir("notes").iterdir()} == {"sentences", "users"}  # no temporary leftovers


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(format="ag_news", users="column"), "ag_news users"),
        (dict(format="jsonl"), "needs --text-col"),
        (dict(format="csv", text_col="t"), "needs --user-col"),
        (dict(format="conll2003", users="chunk:5"), "fixed users"),
        (dict(format="jsonl", text_col="t", users="chunk:0"), "chunk size must be a positive integer"),
        (dict(format="pdf"), "unknown format 'pdf'"),
    ],
)
def test_invalid_options_are_named(options: dict, message: str) -> None:
    with pytest.raises(UedpError, match=message):
        IngestOptions(**options)


def test_cli_bad_input_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    """`uedp ingest` on a malformed file: one stderr line naming the file and line, no traceback, nothing
    half-written (in process: the entry point's own exit is tests/test_cli_entry.py's)."""
    from typer.testing import CliRunner

    from uedp.cli import app

    bad = write(tmp_path / "eng.train", "EU NNP I-NP B-ORG\nrejects VBZ I-VP\n")
    result = CliRunner().invoke(app, ["ingest", "conll2003", str(bad), "--name", "x", "--home", str(tmp_path / "h")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {bad}:2: expected 4 columns like the lines before, got 3"], result.stderr
    assert not (tmp_path / "h" / "datasets" / "x" / "sentences").exists()
