"""Issue 49, item 4: hyperparameters chosen on public text (``uedp tune``) and taken by a private run
(``--tuned``), through the real CLI, MLflow store and tiny runs: the search never reads the private rows,
chooses the trial it reports, is reused, is named in the private run's statement, and a search on the
private run's own text (under any name) is refused."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.commands import app
from uedp.services.tuned import read_record, records

from support import REPO

runner = CliRunner()
USER_LEVEL = ["--mechanism", "userdp", "--noise-multiplier", "0.5", "--rounds", "2", "--q-user", "0.5",
              "--local-update", "gradient", "--threads", "1", "--seeded", "--checkpoint-every", "0"]
ON_ITS_TEXT = "whose text is the text this run protects"


def _ok(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output + (result.stderr or "")
    return str(result.output)


def _refused(result, message: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code != 0, result.output
    assert message in result.output.replace("\n", " ") + (result.stderr or "").replace("\n", " ")


def _messages(path: Path, users: int, seed: int) -> Path:
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_demo_corpus.py"), "--users", str(users), "--seed",
                    str(seed), "--out", str(path)], check=True, capture_output=True)
    return path


def _runs(home) -> int:  # type: ignore[no-untyped-def]
    client = MlflowClient(tracking_uri=home.mlflow_tracking_uri)
    return sum(len(client.search_runs([e.experiment_id])) for e in client.search_experiments())


@pytest.fixture
def datasets(home, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A private dataset and a public proxy of generated messages by other writers (other seeds)."""
    private, public = (_messages(tmp_path / f"{name}.conll", users=60, seed=seed)
                       for name, seed in (("private", 1), ("public", 2)))
    for name, path in (("private", private), ("proxy", public)):
        _ok(runner.invoke(app, ["ingest", "conll2003", str(path), "--name", name, "--split", "users",
                                "--home", str(home.root)]))
    return public


def test_a_search_on_public_text_chooses_its_best_trial_without_reading_the_private_rows(  # type: ignore[no-untyped-def]
        home, datasets: Path, tmp_path: Path) -> None:
    search = ["tune", "proxy", *USER_LEVEL, "--grid", "server_lr=1e-4,0.3", "--home", str(home.root)]
    # the private dataset's tables are not there while the search runs: it cannot read them
    hidden = tmp_path / "hidden"
    shutil.move(home.root / "datasets" / "private", hidden)
    out = _ok(runner.invoke(app, search))
    shutil.move(hidden, home.root / "datasets" / "private")

    key = re.findall(r"--tuned (\w+)", out)[-1]
    record = read_record(home, key)
    assert record is not None and record.dataset == "proxy" and len(record.trials) == 2
    best = min(record.trials, key=lambda t: t.perplexity_valid)
    assert record.chosen == best.values
    client = MlflowClient(tracking_uri=home.mlflow_tracking_uri)
    for trial in record.trials:  # each trial is a real run on the proxy, with its grid value
        run = client.get_run(trial.run_id)
        assert run.data.params["dataset"] == "proxy"
        assert float(run.data.params["server_lr"]) == trial.values["server_lr"]
        assert run.data.metrics["perplexity_valid"] == pytest.approx(trial.perplexity_valid)
    # the same search again: reused, nothing trained
    before = _runs(home)
    again = _ok(runner.invoke(app, search))
    assert "already done" in again and _runs(home) == before and len(records(home)) == 1

    # A private run takes the chosen value and names the search in its statement
    trained = _ok(runner.invoke(app, ["train", "private", *USER_LEVEL, "--tuned", key, "--home", str(home.root)]))
    run = client.get_run(re.findall(r"MLflow run: (\w+)", trained)[-1])
    assert float(run.data.params["server_lr"]) == record.chosen["server_lr"] and run.data.params["tuned"] == key
    assert f"chosen by uedp tune {key}" in run.data.params["privacy_public"]
    assert "on dataset 'proxy'" in run.data.params["privacy_public"]


def test_a_search_on_the_runs_own_text_or_outside_the_tunable_settings_is_refused(home, datasets: Path) -> None:  # type: ignore[no-untyped-def]
    out = _ok(runner.invoke(app, ["tune", "proxy", *USER_LEVEL, "--grid", "server_lr=1e-3,1e-2",
                                  "--home", str(home.root)]))
    key = re.findall(r"--tuned (\w+)", out)[-1]
    _refused(runner.invoke(app, ["train", "proxy", *USER_LEVEL, "--tuned", key, "--home", str(home.root)]),
             ON_ITS_TEXT)
    # the proxy's text ingested again under another name is the same text
    _ok(runner.invoke(app, ["ingest", "conll2003", str(datasets), "--name", "renamed", "--split", "users",
                            "--home", str(home.root)]))
    _refused(runner.invoke(app, ["train", "renamed", *USER_LEVEL, "--tuned", key, "--home", str(home.root)]),
             ON_ITS_TEXT)
    # a mechanism without the chosen parameter, and a search that does not exist
    _refused(runner.invoke(app, ["train", "private", "--mechanism", "dpsgd", "--noise-multiplier", "1", "--steps",
                                 "1", "--tuned", key, "--home", str(home.root)]), "which dpsgd does not take")
    _refused(runner.invoke(app, ["train", "private", *USER_LEVEL, "--tuned", key, "--server-lr", "0.5",
                                 "--home", str(home.root)]), "sets the searched values: drop --server-lr")
    _refused(runner.invoke(app, ["train", "private", *USER_LEVEL, "--tuned", "0123456789abcdef",
                                 "--home", str(home.root)]), "no such search in this data home")
    recorded = json.loads(next((home.root / "tuned").glob("*.json")).read_text())
    assert recorded["lineage"] and recorded["chosen"]

    # a grid outside what a search may choose is refused before anything trains
    before = _runs(home)
    for grid, message in (("target_epsilon=2,8", "a search chooses only"), ("server_lr=1e-3", "the grid has one point"),
                          ("server_lr=0,1e-3", "give positive numbers"), ("lr=1e-3,1e-2", "userdp has no such parameter")):
        _refused(runner.invoke(app, ["tune", "proxy", *USER_LEVEL, "--grid", grid, "--home", str(home.root)]), message)
    assert _runs(home) == before
