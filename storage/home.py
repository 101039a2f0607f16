"""The data home (``UEDP_HOME``, default ``./.uedp``): where datasets, models and the MLflow store live.

Everything uedp writes goes below one folder, so a user can inspect, move or delete it as a unit.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from uedp.errors import UedpError

DEFAULT_HOME = ".uedp"
_DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def validate_dataset_name(name: str) -> str:
    """Dataset names become folder names and MLflow experiment names: keep them plain."""
    if not _DATASET_NAME.match(name):
        raise UedpError(
            f"invalid dataset name {name!r}: use 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class DataHome:
    root: Path

    @classmethod
    def from_env(cls, override: str | os.PathLike[str] | None = None) -> "DataHome":
        """Resolve the home from an explicit path, else ``UEDP_HOME``, else ``./.uedp``; create it."""
        raw = override if override is not None else os.environ.get("UEDP_HOME", DEFAULT_HOME)
        root = Path(raw).expanduser().resolve()
        if root.exists() and not root.is_dir():
            raise UedpError(f"data home {root} exists and is not a folder (set UEDP_HOME or --home)")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UedpError(f"cannot create data home {root}: {exc.strerror}") from exc
        return cls(root)

    def dataset_dir(self, dataset: str) -> Path:
        return self.root / "datasets" / validate_dataset_name(dataset)

    def table_dir(self, dataset: str, table: str) -> Path:
        """One folder per table: ``data.parquet`` plus ``manifest.json``, replaced as a unit."""
        return self.dataset_dir(dataset) / table

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def mlflow_tracking_uri(self) -> str:
        return f"sqlite:///{self.mlflow_db}"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlartifacts"

    def checkpoint_dir(self, dataset: str, fingerprint: str) -> Path:
        """Where a training configuration's resumable checkpoint lives until the run finishes."""
        return self.root / "checkpoints" / f"{validate_dataset_name(dataset)}-{fingerprint}"

    def reports_dir(self, dataset: str) -> Path:
        return self.root / "reports" / validate_dataset_name(dataset)

    @property
    def prefect_home(self) -> Path:
        return self.root / "prefect"
