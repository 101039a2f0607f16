"""A dataset declared public at ingest (``uedp ingest ... --public WHY``; issue 68, item 7): a search's proxy
or a pretraining corpus. Its runs are charged to no privacy ledger and state the declaration among what
they treat as public; a declaration is refused while a private dataset of the home holds the same text;
ingesting again without it makes the dataset private, and its next run is charged. Real CLI, Prefect
flows, Parquet tables, MLflow store and ledger files."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.commands import app
from uedp.services import privacy_budget
from uedp.services.tracking import tracking_uri
from uedp.storage.home import DataHome
from uedp.storage.public_declaration import public_declaration

from support import demo_halves

runner = CliRunner()
SPLIT = ["--split", "users", "--valid-fraction", "0.25", "--test-fraction", "0.25"]  # held-out writers in each half
WHY = "made-up news the tests wrote, published"
TINY = ["--mechanism", "dpsgd", "--steps", "2", "--batch-size", "8", "--noise-multiplier", "1", "--threads", "1",
        "--checkpoint-every", "0"]


def _cli(home: DataHome, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [*args, "--home", str(home.root)])


def _run_id(output: str) -> str:
    return output.split("MLflow run: ")[1].split()[0]


@pytest.mark.slow
def test_a_dataset_declared_public_is_charged_nothing_and_says_so(home: DataHome, tmp_path: Path,
                                                                  prefect_server) -> None:  # type: ignore[no-untyped-def]
    private, public = demo_halves(tmp_path)
    declared = _cli(home, "ingest", "conll2003", str(public), "--name", "news", *SPLIT, "--public", WHY)
    assert declared.exit_code == 0, declared.output
    assert f"news: declared public ({WHY})" in declared.output and public_declaration(home, "news") == WHY
    trained = _cli(home, "train", "news", *TINY)
    assert trained.exit_code == 0, trained.output
    assert privacy_budget.ledger_of(home, "news").read().entries == ()  # no ledger entry
    params = MlflowClient(tracking_uri=tracking_uri(home)).get_run(_run_id(trained.stdout)).data.params
    assert f"the text of 'news' (declared public at ingest: {WHY})" in params["privacy_public"]
    budget = _cli(home, "budget", "news")
    assert budget.exit_code == 0 and "was declared public at ingest" in budget.output
    assert "nothing released from this dataset's text yet" in budget.output
    refused = _cli(home, "budget", "news", "--limit", "3")
    assert refused.exit_code == 2 and "is declared public" in refused.output
    assert f"declared public: {WHY}" in _cli(home, "datasets").output

    # a private dataset ingested later with the public one's text: warned that its budget cannot count those runs
    later = _cli(home, "ingest", "conll2003", str(public), "--name", "news-again", *SPLIT)
    assert later.exit_code == 0 and public_declaration(home, "news-again") is None
    assert "warning: 'news-again' holds the same text as 'news', declared public at ingest" in later.stderr

    # a copy of a private text declared public: refused, and the copy stays private
    assert _cli(home, "ingest", "conll2003", str(private), "--name", "patients", *SPLIT).exit_code == 0
    copy = _cli(home, "ingest", "conll2003", str(private), "--name", "copy", *SPLIT, "--public", WHY)
    assert copy.exit_code == 2, copy.output
    assert "'copy' is ingested, as a private dataset" in copy.output and "'patients'" in copy.output
    assert public_declaration(home, "copy") is None
    private_run = _cli(home, "train", "copy", *TINY)
    assert private_run.exit_code == 0 and len(privacy_budget.ledger_of(home, "copy").read().entries) == 1

    # ingested again without --public: private again, and its next run is charged
    again = _cli(home, "ingest", "conll2003", str(public), "--name", "news", *SPLIT)
    assert again.exit_code == 0 and "news: no longer declared public" in again.output
    charged = _cli(home, "train", "news", *TINY)
    assert charged.exit_code == 0, charged.output
    [entry] = privacy_budget.ledger_of(home, "news").read().entries
    assert entry.mechanism == "dpsgd" and entry.epsilon > 0
