"""Issue 63, item 2: a new data home's MLflow store is a copy of an empty one migrated once, that names the
home's own artifact folder, and a home that has a store keeps it."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from uedp.services import mlflow_store
from uedp.services.tracking import experiment_id_for, tracking_uri
from uedp.storage.home import DataHome


def test_new_homes_copy_one_migrated_store_and_keep_their_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(mlflow_store.TEMPLATES_ENV, str(tmp_path / "templates"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first, second = (DataHome.from_env(tmp_path / name) for name in ("first", "second"))

    client = MlflowClient(tracking_uri=tracking_uri(first))
    (template,) = (tmp_path / "templates").glob("mlflow-*-empty.db")
    assert first.mlflow_db.read_bytes() != template.read_bytes()  # the copy names its own artifact folder
    assert client.get_experiment("0").artifact_location == (first.mlflow_artifacts / "0").as_uri()
    run = client.create_run(experiment_id_for(client, first, "demo"))
    client.log_metric(run.info.run_id, "perplexity", 12.5)
    assert client.get_run(run.info.run_id).info.artifact_uri.startswith((first.mlflow_artifacts / "demo").as_uri())

    # the template is made once: a second home copies it, and nothing replaces the first home's store
    made = template.stat().st_mtime_ns
    other = MlflowClient(tracking_uri=tracking_uri(second))
    assert template.stat().st_mtime_ns == made and other.search_runs(["0"]) == []
    mlflow_store.seed_store(first)
    assert client.get_run(run.info.run_id).data.metrics == {"perplexity": 12.5}
