"""The data home (``UEDP_HOME``, default ``./.uedp``): where datasets, models and the MLflow store live.

Everything uedp writes goes below one folder, so a user can inspect, move or delete it as a unit.
"""

from __future__ import annotations

import hashlib
import hmac
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
    def from_env(cls, override: str | os.PathLike[str] | None = None) -> DataHome:
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
        return self.datasets_dir / validate_dataset_name(dataset)

    def dataset_folders(self) -> list[str]:
        """The names of the folders under ``datasets/`` (complete datasets, and any a crash left behind)."""
        root = self.datasets_dir
        return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []

    def table_dir(self, dataset: str, table: str) -> Path:
        """One folder per table: ``data.parquet`` plus ``manifest.json``, replaced as a unit."""
        return self.dataset_dir(dataset) / table

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def mlflow_tracking_uri(self) -> str:
        return sqlite_uri(self.mlflow_db)

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlartifacts"

    def checkpoint_dir(self, dataset: str, fingerprint: str) -> Path:
        """Where a training configuration's resumable checkpoint lives until the run finishes."""
        return self.root / "checkpoints" / f"{validate_dataset_name(dataset)}-{fingerprint}"

    # Named locations: every folder of the data home is named here, once (tests/test_architecture.py refuses
    # paths built from the root outside storage).

    @property
    def datasets_dir(self) -> Path:
        return self.root / "datasets"

    def cache_dir(self, kind: str) -> Path:
        """Remembered computations of one kind (``mappings``, ``attacks``, ``wheels``, ``releases``, ...): each
        named by the content key of its inputs, so deleting the folder only costs the time to redo them."""
        return self.root / "cache" / kind

    @property
    def bases_dir(self) -> Path:
        """Public base models: pretrained (``uedp pretrain``) or installed from a package (``uedp base``)."""
        return self.root / "bases"

    @property
    def tokenizers_dir(self) -> Path:
        """BPE vocabularies trained on public text for a base."""
        return self.root / "tokenizers"

    @property
    def tuned_dir(self) -> Path:
        """The records of `uedp tune`'s searches on public text."""
        return self.root / "tuned"

    def ner_model_dir(self, dataset: str) -> Path:
        """A spaCy NER trained by `uedp ner train` on a dataset's gold tags."""
        return self.root / "models" / f"ner-{validate_dataset_name(dataset)}"

    def inputs_dir(self, dataset: str) -> Path:
        """Local copies of a dataset's inputs given as URLs (fetched before ingest reads them)."""
        return self.root / "inputs" / validate_dataset_name(dataset)

    def init_dir(self, run_id: str) -> Path:
        """A run's logged model, downloaded once to start another run from (``--init-from RUN_ID``)."""
        return self.root / "init" / run_id

    @property
    def active_runs_dir(self) -> Path:
        """Markers of the MLflow runs this home's processes are training (a killed one is found by its marker)."""
        return self.root / "runs" / "active"

    @property
    def stack_dir(self) -> Path:
        """The logs and state of `uedp serve`'s local stack."""
        return self.root / "stack"

    @property
    def reproduce_dir(self) -> Path:
        """The results pages' work: their inputs, homes and pages (``uedp reproduce``)."""
        return self.root / "reproduce"

    @property
    def measures_dir(self) -> Path:
        """Figures measured on public or held-out text, remembered by the content key of what they measured
        (a start's perplexity before fine-tuning: minutes for a 135M-parameter model on a test file)."""
        return self.cache_dir("measures")

    def generation_dir(self, key: str) -> Path:
        """The batches a synthetic corpus has sampled so far, until it is written whole (``uedp generate``)."""
        return self.root / "checkpoints" / f"generate-{key[:24]}"

    @property
    def audits_dir(self) -> Path:
        """One-run audit plans with their secret coins: kept here, never logged (the audit's key)."""
        return self.root / "audits"

    @property
    def model_lineage_dir(self) -> Path:
        """Every model a run logged, by the content hash of its files: which run made it and which texts
        its weights saw, so a copy of it is known wherever it turns up (services.lineage)."""
        return self.root / "lineage"

    def reports_dir(self, dataset: str) -> Path:
        return self.root / "reports" / validate_dataset_name(dataset)

    @property
    def labels_file(self) -> Path:
        """Labels mapped onto entity categories, and categories of one's own, merged over the taxonomy
        (``uedp detect --label LABEL=CATEGORY`` writes it; detection/categories.py reads it)."""
        return self.root / "labels.yaml"

    @property
    def prefect_home(self) -> Path:
        return self.root / "prefect"

    @property
    def secret_file(self) -> Path:
        return self.root / ".secret"

    def keyed_id(self, key: str) -> str:
        """A stand-in for a content key that can be released: an HMAC under this home's secret.

        Content keys hash the corpus itself, so anyone who can guess D or D' could recompute one and
        tell them apart; the keyed id still tells runs on the same data apart from runs on other data,
        but only to someone holding the home's secret (created on first use, readable by its owner only).
        """
        return self.keyed_ids([key])[0]

    def keyed_ids(self, keys: list[str]) -> list[str]:
        """:meth:`keyed_id` of many keys, reading the secret once (one per sentence of a corpus)."""
        secret = self._secret() if any(keys) else b""
        return [hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:16] if key else "" for key in keys]

    def _secret(self) -> bytes:
        if not self.secret_file.is_file():
            partial = self.secret_file.with_suffix(f".partial-{os.getpid()}")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(os.urandom(32))
            try:
                os.link(partial, self.secret_file)  # first writer wins; a concurrent one keeps the winner's
            except FileExistsError:
                pass
            finally:
                partial.unlink(missing_ok=True)
        return self.secret_file.read_bytes()


def sqlite_uri(database: Path) -> str:
    """MLflow's address of a SQLite store file (the one spelling of it: tests/test_architecture.py refuses another)."""
    return f"sqlite:///{database}"
