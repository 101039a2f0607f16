"""Shared fixtures. Prefect runs against a real temporary server (prefect_test_harness), MLflow
against a real SQLite store, and storage against real Parquet files, all under pytest's tmp dirs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_CONLL = REPO.parent / "shared" / "data" / "conll2003"


@pytest.fixture
def home(tmp_path: Path):
    from uedp.storage.home import DataHome

    return DataHome.from_env(tmp_path / "home")


@pytest.fixture(scope="session")
def prefect_server():
    """One real temporary Prefect server for the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path
