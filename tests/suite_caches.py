"""What the test suite's processes share across tests, workers and runs: remembered accounting figures
(privacy.accounting.memo) and the migrated empty MLflow store new homes copy (services.mlflow_store)."""

from __future__ import annotations

import hashlib
import tempfile
from importlib.metadata import version
from pathlib import Path


def accounting_cache_folder() -> str:
    """One folder for both test workers and for later runs of the same code: named by a hash of the code
    that computes the figures and of dp_accounting's version, so a change to either starts an empty one."""
    digest = hashlib.sha256(version("dp-accounting").encode())
    for source in sorted((Path(__file__).resolve().parents[1] / "privacy" / "accounting").glob("*.py")):
        digest.update(source.read_bytes())
    return str(Path(tempfile.gettempdir()) / f"uedp-test-accounting-{digest.hexdigest()[:16]}")


def store_templates_folder() -> str:
    """The empty MLflow store, migrated once (the file is named by MLflow's version)."""
    return str(Path(tempfile.gettempdir()) / "uedp-test-stores")
