"""A data home's MLflow store, started from an empty one migrated once per machine.

MLflow builds a new SQLite store by running every one of its schema migrations, 9 to 11 seconds on a
2-core machine, the first time anything touches a new data home (the demo's first command, every test's
home). The result is the same empty store every time for one MLflow version, so uedp migrates it once,
keeps it (``~/.cache/uedp/mlflow-<version>-empty.db``, or under ``UEDP_STORE_TEMPLATES``), and copies
it into each new home. The copy names the home's own artifact folder for MLflow's Default experiment;
uedp's experiments name theirs when they are created (:func:`services.tracking.experiment_id_for`).

A store is only ever created where none exists (``os.link`` of a finished copy, so a process that
started writing runs into a home's store never has it replaced), and any failure here falls back to
letting MLflow create the store itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from uedp.storage.home import DataHome, sqlite_uri

TEMPLATES_ENV = "UEDP_STORE_TEMPLATES"


def template_folder() -> Path:
    raw = os.environ.get(TEMPLATES_ENV, "")
    return Path(raw) if raw else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "uedp"


def empty_store() -> Path:
    """The migrated empty store of this MLflow version, made on first use."""
    import mlflow
    from mlflow.tracking import MlflowClient

    template = template_folder() / f"mlflow-{mlflow.__version__}-empty.db"
    if template.is_file():
        return template
    template.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=template.parent) as scratch:
        made = Path(scratch) / "mlflow.db"
        MlflowClient(tracking_uri=sqlite_uri(made)).search_experiments()  # creates and migrates it
        os.replace(made, template)  # whole, or not at all: another process may be making the same one
    return template


def seed_store(home: DataHome) -> None:
    """Give a home without a store a copy of the empty one (nothing when it has one)."""
    if home.mlflow_db.exists():
        return
    with contextlib.suppress(Exception):  # any trouble: MLflow creates the store as it always did
        template = empty_store()
        handle, scratch = tempfile.mkstemp(prefix=".mlflow-", suffix=".db", dir=home.root)
        os.close(handle)
        try:
            shutil.copyfile(template, scratch)
            with contextlib.closing(sqlite3.connect(scratch)) as db, db:
                db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                           ((home.mlflow_artifacts / "0").as_uri(),))
            os.link(scratch, home.mlflow_db)  # fails if another process made the store meanwhile
        finally:
            Path(scratch).unlink(missing_ok=True)
