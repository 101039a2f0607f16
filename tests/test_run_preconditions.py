"""Issue 47, item 7: a run that could not be evaluated, or that its mechanism cannot train, stops before it
spends anything (no DP count drawn, no ledger entry, no MLflow run), with one line saying why and what fixes
it. On main, a one-user corpus trained userdp and printed `test perplexity nan` with no warning.

Real CLI, real ingest, real MLflow store."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.commands import app
from uedp.privacy.mechanisms import registry
from uedp.services import privacy_budget

from support import write

runner = CliRunner()
QUICK = ["--threads", "1", "--checkpoint-every", "0"]


def _lines(path: Path, user: str, count: int) -> Path:
    return write(path, "\n".join(json.dumps({"text": f"{user} wrote line {i} about the Harbourline trip.",
                                             "user": user}) for i in range(count)))


def _nothing_spent(home, dataset: str) -> None:  # type: ignore[no-untyped-def]
    experiment = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_experiment_by_name(dataset)
    assert experiment is None or not MlflowClient(tracking_uri=home.mlflow_tracking_uri).search_runs(
        [experiment.experiment_id])
    assert not privacy_budget.ledger_of(home, dataset).read().entries


def test_a_corpus_without_a_test_split_is_refused_by_every_mechanism_and_said_at_ingest(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    corpus = _lines(tmp_path / "one.jsonl", "alice", 40)
    ingested = runner.invoke(app, ["ingest", "jsonl", str(corpus), "--name", "one", "--split", "users", "--text-col",
                                   "text", "--user-col", "user", "--home", str(home.root)])
    assert ingested.exit_code == 0, ingested.output
    assert "has no test split: `uedp train` will refuse it" in ingested.stderr.replace("\n", " ")
    for mechanism in (["--mechanism", "noiseless", "--steps", "2"], ["--mechanism", "userdp", "--rounds", "2"],
                      ["--mechanism", "dpsgd", "--steps", "2"]):
        result = runner.invoke(app, ["train", "one", "--home", str(home.root), *mechanism, *QUICK])
        assert result.exit_code == 2, result.output
        said = result.stderr.replace("\n", " ")
        assert f"dataset 'one' has no test sentences: {mechanism[1]} could not be evaluated" in said
        assert "--split-of FILE=test" in said and "nan" not in result.stdout
    _nothing_spent(home, "one")


def test_a_single_training_user_stops_user_level_mechanisms_but_not_dpsgd(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    train = _lines(tmp_path / "alice.jsonl", "alice", 40)
    held = write(tmp_path / "held.jsonl", "\n".join(json.dumps({"text": f"Line {i} from the held-out writers.",
                                                               "user": f"h{i % 4}"}) for i in range(12)))
    ingested = runner.invoke(app, ["ingest", "jsonl", str(train), str(held), "--name", "one", "--text-col", "text",
                                   "--user-col", "user", "--split-of", "alice.jsonl=train", "--split-of",
                                   "held.jsonl=test", "--home", str(home.root)])
    assert ingested.exit_code == 0, ingested.output
    result = runner.invoke(app, ["train", "one", "--home", str(home.root), "--mechanism", "userdp", "--rounds", "2",
                                 *QUICK])
    assert result.exit_code == 2, result.output
    said = result.stderr.replace("\n", " ")
    assert "dataset 'one' has fewer than 2 users in its train split: userdp protects each user's" in said
    assert "--users chunk:N" in said and len(result.stderr.strip().splitlines()) == 1  # one line, the fix in it
    _nothing_spent(home, "one")
    # every mechanism whose unit is a user says so (uedp's and uedp-bounded's runs also need an entities table)
    assert {name for name in registry.names() if registry.get(name).min_train_users > 1} == {
        "userdp", "uedp", "uedp-naive", "uedp-bounded"}
    dpsgd = runner.invoke(app, ["train", "one", "--home", str(home.root), "--mechanism", "dpsgd", "--steps", "2", *QUICK])
    assert dpsgd.exit_code == 0, dpsgd.output  # one sequence is its unit: a single writer is no obstacle
