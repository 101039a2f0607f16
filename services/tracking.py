"""MLflow tracking: one experiment per dataset, one run per training configuration.

Only counts, categories, hyperparameters and metrics are logged; entity text never leaves the data
home. The store is a local SQLite file in the data home unless ``MLFLOW_TRACKING_URI`` points
elsewhere (an MLflow server), so the same code serves the demo and a team deployment.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from uedp.errors import UedpError
from uedp.models.saving import BaseIdentity, save_model
from uedp.processes import process_alive
from uedp.services.mlflow_store import seed_store
from uedp.storage.home import DataHome

# MLflow 3's UI opens an experiment by its kind: without this tag it may guess "GenAI" and open on traces,
# which uedp never logs; model training opens on the runs table and the metric charts.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING = "custom_model_development"


def tracking_uri(home: DataHome) -> str:
    """Where runs are logged: ``MLFLOW_TRACKING_URI`` (a server), else the home's SQLite store, which a new
    home gets as a copy of an empty one migrated once (:mod:`services.mlflow_store`)."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    seed_store(home)
    return home.mlflow_tracking_uri


# MLflow 3's UI opens every page (experiments, an experiment, a run) in its GenAI view unless the address says
# otherwise: the view is read from this query, else from the browser's last choice, which starts as GenAI
# (a run then shows under "Evaluation runs"). Every address uedp prints carries it.
WORKFLOW_QUERY = "workflowType=machine_learning"
MODEL_TRAINING_VIEW = f"#/experiments?{WORKFLOW_QUERY}"


def ui_command(home: DataHome, page: str = MODEL_TRAINING_VIEW) -> str:
    """How to look at the runs: the tracking server's page, or the command that serves the local store."""
    uri = tracking_uri(home)
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/{page}"
    return f"mlflow ui --backend-store-uri {uri}, then http://127.0.0.1:5000/{page}"


def experiment_page(experiment_id: str) -> str:
    """An experiment's runs table in the model-training view (the address after the server's)."""
    return f"#/experiments/{experiment_id}/runs?{WORKFLOW_QUERY}"


def run_page(experiment_id: str, run_id: str) -> str:
    """A run's page in the model-training view (metrics, parameters, artifacts), not among GenAI evaluations."""
    return f"#/experiments/{experiment_id}/runs/{run_id}?{WORKFLOW_QUERY}"


def run_link(home: DataHome, run_id: str) -> str:
    """How to open one run: its page on the tracking server, or the command that serves the local store."""
    run = MlflowClient(tracking_uri(home)).get_run(run_id)
    return ui_command(home, run_page(run.info.experiment_id, run_id))


def dataset_link(home: DataHome, dataset: str) -> str:
    """How to open a dataset's experiment (its runs, side by side); the experiments list when it has none yet."""
    found = MlflowClient(tracking_uri(home)).get_experiment_by_name(dataset)
    return ui_command(home, experiment_page(found.experiment_id) if found is not None else MODEL_TRAINING_VIEW)


class Leases:
    """Which process owns each RUNNING run this machine started: ``<home>/runs/active/<run id>.json``.

    A run whose process was killed (``kill -9``, out of memory, a lost terminal) cannot end itself and
    would stay RUNNING in MLflow forever; the next run opened from this data home marks such runs KILLED.
    The files stay in the data home (process ids are not released)."""

    def __init__(self, home: DataHome):
        self.folder = home.active_runs_dir

    def take(self, run_id: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.folder / f".{run_id}.{os.getpid()}.partial"  # whole or absent: a reaper never reads half
        partial.write_text(json.dumps({"pid": os.getpid()}), encoding="utf-8")
        os.replace(partial, self.folder / f"{run_id}.json")

    def release(self, run_id: str) -> None:
        (self.folder / f"{run_id}.json").unlink(missing_ok=True)

    def reap(self, client: MlflowClient) -> list[str]:
        """End the runs whose owning process is gone as KILLED; returns their ids."""
        ended: list[str] = []
        for lease in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            try:
                pid = int(json.loads(lease.read_text(encoding="utf-8"))["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                pid = -1  # unreadable: its writer died mid-write
            if pid > 0 and process_alive(pid):
                continue
            run_id = lease.stem
            with contextlib.suppress(Exception):  # a run deleted from MLflow meanwhile
                if client.get_run(run_id).info.status == "RUNNING":
                    client.set_terminated(run_id, status="KILLED")
                    ended.append(run_id)
            lease.unlink(missing_ok=True)
        return ended


class RunTracker:
    """A started MLflow run with the few logging calls uedp needs; ``finish`` ends it.

    Opening one first marks KILLED the runs of this data home whose process died (:class:`Leases`)."""

    def __init__(self, home: DataHome, experiment: str, run_name: str, tags: dict[str, str]):
        self.client = MlflowClient(tracking_uri=tracking_uri(home))
        self.leases = Leases(home)
        self.leases.reap(self.client)
        experiment_id = experiment_id_for(self.client, home, experiment)
        self.run_id: str = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
        self.leases.take(self.run_id)

    @classmethod
    def attach(cls, home: DataHome, run_id: str, reopen: bool = False) -> RunTracker:
        """Log to an existing run; ``reopen`` marks it running again (a training resumed from its checkpoint)."""
        tracker = cls.__new__(cls)
        tracker.client = MlflowClient(tracking_uri=tracking_uri(home))
        tracker.leases = Leases(home)
        tracker.run_id = run_id
        if reopen:
            tracker.leases.reap(tracker.client)
            tracker.client.update_run(run_id, status="RUNNING")
            tracker.leases.take(run_id)
        return tracker

    def last_step(self, metric: str) -> int:
        """The highest step ``metric`` was logged at (-1: never): a resumed run re-runs the rounds after
        its last checkpoint, and their points are not logged twice."""
        history = self.client.get_metric_history(self.run_id, metric)
        return max((m.step for m in history), default=-1)

    def log_params(self, params: dict[str, Any]) -> None:
        self.client.log_batch(self.run_id, params=[Param(k, _param(v)) for k, v in sorted(params.items())])

    def log_metrics(self, metrics: dict[str, float], step: int = 0) -> None:
        timestamp = _now_ms()
        finite = [Metric(k, float(v), timestamp, step) for k, v in metrics.items() if math.isfinite(v)]
        if finite:
            self.client.log_batch(self.run_id, metrics=finite)

    def set_tags(self, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, value)

    def log_json(self, obj: Any, name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str), encoding="utf-8")
            self.client.log_artifact(self.run_id, str(path))

    def log_curve_plot(self, xs: list[int], ys: list[float], name: str, xlabel: str, ylabel: str, title: str) -> None:
        fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
        ax.plot(xs, ys, marker="." if len(xs) < 60 else None)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            fig.savefig(path)
            self.client.log_artifact(self.run_id, str(path))
        plt.close(fig)

    def log_file(self, path: Path, folder: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), folder)

    def log_model(self, model: Any, tokenizer: Any, base: BaseIdentity | None = None,
                  before_logging: Callable[[Path], None] | None = None) -> None:
        """The trained model and its tokenizer under the artifact folder ``model`` (a LoRA model as its
        adapter and its base's identity: :mod:`models.saving`); ``before_logging`` sees the saved folder
        first (the run's lineage marker goes in)."""
        with tempfile.TemporaryDirectory() as tmp:
            save_model(model, tokenizer, Path(tmp), base)
            if before_logging is not None:
                before_logging(Path(tmp))
            self.client.log_artifacts(self.run_id, tmp, "model")

    def require_run(self) -> None:
        """A clear error for a run id this tracking store does not have."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(self.run_id)
        except MlflowException:
            raise UedpError(f"no MLflow run {self.run_id!r} in {self.client.tracking_uri}") from None

    def download(self, path: str, into: Path) -> Path | None:
        """A logged artifact (file or folder) copied under ``into``; None when the run has no such artifact."""
        if not any(a.path == path for a in self.client.list_artifacts(self.run_id)):
            return None
        return Path(self.client.download_artifacts(self.run_id, path, str(into)))

    def params(self) -> dict[str, str]:
        return dict(self.client.get_run(self.run_id).data.params)

    def finish(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
        self.leases.release(self.run_id)


def experiment_id_for(client: MlflowClient, home: DataHome, experiment: str) -> str:
    """The experiment of a dataset, created on first use (artifacts in the data home for a local store)."""
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        if found.tags.get(EXPERIMENT_KIND_TAG) is None:  # made by an older uedp: open it in the runs view too
            client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
        return str(found.experiment_id)
    home.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
    location = (home.mlflow_artifacts / experiment).as_uri() if tracking_uri(home).startswith("sqlite") else None
    return str(client.create_experiment(experiment, artifact_location=location,
                                        tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING}))


def _param(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return "none" if value is None else str(value)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
