"""What a user sees at the terminal (issue 37, items 7-9): Ctrl-C says what happened and how to go on, a
resumed training says so when it resumes, step-based runs count steps, tables are queried with `uedp sql`,
and a run from a pretrained start is named apart from one from scratch. Real CLI, MLflow, Parquet, DuckDB."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from uedp.commands import app
from uedp.flows.demo import DEMO_CORPUS
from uedp.services.config import TrainConfig
from uedp.services.tracking import RunTracker
from uedp.storage.catalog import Catalog
from uedp.storage.ingest import IngestOptions, ingest

runner = CliRunner()


@pytest.fixture
def demo(home) -> str:  # type: ignore[no-untyped-def]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    return "demo"


def test_ctrl_c_says_it_was_interrupted_and_how_to_resume_and_the_rerun_says_it_resumed(
        home, demo: str, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    train = ["train", demo, "--home", str(home.root), "--mechanism", "dpsgd", "--steps", "4", "--batch-size", "4",
             "--checkpoint-every", "2", "--noise-multiplier", "1", "--threads", "1"]
    original = RunTracker.log_metrics

    def ctrl_c_after_step_3(self, metrics, step=0):  # type: ignore[no-untyped-def]
        if step == 3 and "train_loss" in metrics:
            raise KeyboardInterrupt
        return original(self, metrics, step)

    monkeypatch.setattr(RunTracker, "log_metrics", ctrl_c_after_step_3)
    interrupted = runner.invoke(app, train)
    assert interrupted.exit_code == 130
    assert "interrupted (Ctrl-C). Run the same command again" in interrupted.stderr
    monkeypatch.setattr(RunTracker, "log_metrics", original)
    resumed = runner.invoke(app, train)
    assert resumed.exit_code == 0, resumed.output
    said = resumed.stderr
    assert "resumed from the checkpoint of step 2, in the same MLflow run" in said
    # said when it resumed: before the progress reached the end of the run
    assert said.index("resumed from the checkpoint") < said.index("4/4 steps")
    assert re.search(r"after 4 steps \(resumed after step 2\)", resumed.stdout)


def test_uedp_sql_queries_the_datasets_tables_with_duckdb(home, demo: str) -> None:  # type: ignore[no-untyped-def]
    result = runner.invoke(app, ["sql", demo, "SELECT split, count(*) AS n FROM sentences GROUP BY split ORDER BY split",
                                 "--home", str(home.root)])
    assert result.exit_code == 0, result.output
    with Catalog(home, demo) as catalog:
        counts = dict(catalog.con.execute("SELECT split, count(*) FROM sentences GROUP BY split").fetchall())
    for split, n in counts.items():
        assert re.search(rf"{split}\s*│\s*{n}\b", result.stdout), result.stdout
    wrong = runner.invoke(app, ["sql", demo, "SELECT nothing FROM entities", "--home", str(home.root)])
    assert wrong.exit_code == 2 and wrong.stderr.startswith("error: ") and "views: sentences, users" in wrong.stderr
    missing = runner.invoke(app, ["sql", "nope", "SELECT 1", "--home", str(home.root)])
    assert missing.exit_code == 2 and "nope" in missing.stderr


def test_a_run_from_a_pretrained_start_is_named_apart_from_one_from_scratch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    scratch = TrainConfig(dataset="d", mechanism="userdp", target_epsilon=8.0)
    from_run = TrainConfig(dataset="d", mechanism="userdp", target_epsilon=8.0,
                           init_from="b79ff9a567734506b7f0dc86bee6beee")
    assert scratch.run_name() == "userdp-eps8-s0"
    assert from_run.run_name() == "userdp-from-b79ff9a5-eps8-s0"
    folder = TrainConfig(dataset="d", mechanism="dpsgd", init_from=str(tmp_path / "my-public-model"))
    assert "from-my-public-model" in folder.run_name()
    # a length other than the mechanism's default is part of the name: 1 step and 150 are two names
    one, many = (TrainConfig(dataset="d", mechanism="noiseless", init_from="b79ff9a567734506b7f0dc86bee6beee",
                             steps=steps) for steps in (1, 150))
    assert (one.run_name(), many.run_name()) == ("noiseless-from-b79ff9a5-steps1-s0", "noiseless-from-b79ff9a5-steps150-s0")
    assert one.run_name(with_length=False) == "noiseless-from-b79ff9a5-s0"  # the name before lengths were shown
    assert TrainConfig(dataset="d", mechanism="userdp", rounds=50, target_epsilon=8.0).run_name() == "userdp-rounds50-eps8-s0"
    assert TrainConfig(dataset="d", mechanism="userdp").step_word == "round"
    assert TrainConfig(dataset="d", mechanism="dpsgd").step_word == "step"


def _conll(sentences: int, docstart_every: int | None) -> str:
    lines = []
    for i in range(sentences):
        if docstart_every and i % docstart_every == 0:
            lines += ["-DOCSTART- -X- -X- O", ""]
        lines += ["Sentence NN O O", f"{i} CD O O", ". . O O", ""]
    return "\n".join(lines) + "\n"


def test_ingest_warns_when_the_users_are_too_few_or_one_holds_much_and_says_what_fixes_it(home, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from support import write

    files = [write(tmp_path / "flat" / f"notes.{split}", _conll(60, None)) for split in ("train", "testa", "testb")]
    flat = runner.invoke(app, ["ingest", "conll2003", *map(str, files), "--name", "flat", "--home", str(home.root)])
    assert flat.exit_code == 0, flat.output
    assert "only 1 user in the train split" in flat.stderr and "-DOCSTART-" in flat.stderr
    # said again when the unchanged inputs are reused
    again = runner.invoke(app, ["ingest", "conll2003", *map(str, files), "--name", "flat", "--home", str(home.root)])
    assert "reused the existing tables" in again.stdout and "only 1 user" in again.stderr
    files = [write(tmp_path / "docs" / f"notes.{split}", _conll(120, 4)) for split in ("train", "testa", "testb")]
    documents = runner.invoke(app, ["ingest", "conll2003", *map(str, files), "--name", "docs", "--home", str(home.root)])
    assert documents.exit_code == 0 and "warning" not in documents.stderr  # 30 documents of 4 sentences
    big = _conll(40, None) + _conll(80, 2)  # one 40-sentence document, then 40 of 2
    files = [write(tmp_path / "big" / f"notes.{split}", big) for split in ("train", "testa", "testb")]
    one_big = runner.invoke(app, ["ingest", "conll2003", *map(str, files), "--name", "big", "--home", str(home.root)])
    assert re.search(r"holds 33% of the train split", one_big.stderr), one_big.stderr
