"""Shared fixtures. Prefect runs against a real temporary server (prefect_test_harness), MLflow
against a real SQLite store, and storage against real Parquet files, all under pytest's tmp dirs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from suite_caches import accounting_cache_folder, store_templates_folder

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread per process, set before torch loads (uedp's default then follows OMP_NUM_THREADS, in
# this process and in the torchrun and Prefect worker processes the tests start): a shared 2-core
# machine oversubscribed by default threads runs a step ten times slower, and seeded runs replay
# exactly only with a fixed thread count.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Calibrations and epsilon schedules remembered by both test workers and by later runs of the same code.
os.environ.setdefault("UEDP_ACCOUNTING_CACHE", accounting_cache_folder())
# Every test home's MLflow store copied from one migrated once (9-11 s each otherwise).
os.environ.setdefault("UEDP_STORE_TEMPLATES", store_templates_folder())

# Prefect sets up its logging when prefect.main is first imported (the first `from prefect import flow`),
# bound to the sys.stderr of that moment, and its dictConfig closes every handler set up before it
# (absl's, from dp_accounting, holds pytest's captured stderr). The CLI imports Prefect only inside a
# command, so a first import inside CliRunner.invoke would bind Prefect to the runner's temporary stream
# and close pytest's ("I/O operation on closed file" in later tests): set it up here, first.
import prefect.main  # noqa: F401  (after the environment above)

from support import SHARED_CONLL


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


@pytest.fixture
def shared_conll() -> Path:
    """The real CoNLL-2003 files beside the checkout (``../shared/data/conll2003``), or a skip that says so."""
    if not (SHARED_CONLL / "eng.train").is_file():
        pytest.skip(f"the CoNLL-2003 files are not at {SHARED_CONLL} (see the README: they sit beside the checkout)")
    return SHARED_CONLL


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules holding a ``slow`` test run first; ``cuda`` tests skip, saying why, where torch sees no GPU
    (`make test` deselects them; `make gpu-check` runs them on a machine with one)."""
    _slow_modules_first(items)
    if not any(item.get_closest_marker("cuda") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `make gpu-check` on a machine with one")
    for item in items:
        if item.get_closest_marker("cuda"):
            item.add_marker(skip)


def _slow_modules_first(items: list[pytest.Item]) -> None:
    """Put the modules that hold a ``slow`` test ahead of the rest, each module whole and in its own order.

    pytest-xdist's worksteal gives each worker half of the collection and lets an idle worker take the
    tail of the other's queue, but never a test already running: a 90-second test that starts late leaves
    the other worker idle for as long (measured: 89 s of 13 minutes). With the long tests early and the
    short ones last, the queues end on tests of a second or less. Modules stay whole so that a module's
    shared fixtures (a trained run, a data home) are built once per worker, not once per slice."""
    slow_modules = {item.module for item in items if item.get_closest_marker("slow")}  # type: ignore[attr-defined]
    items.sort(key=lambda item: getattr(item, "module", None) not in slow_modules)  # stable: order kept within


# Keeping the suite from creeping back (issue 63): `make test` prints the 15 slowest tests, and this section
# names every test whose set-up and call took longer than this without being marked `slow`, so a new one
# is seen in the run that adds it. A section, not a failure: this machine is shared, and timings are noisy.
UNMARKED_LIMIT_S = 20.0
_unmarked_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when in ("setup", "call") and "slow" not in report.keywords:
        _unmarked_durations[report.nodeid] = _unmarked_durations.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    over = sorted(((d, n) for n, d in _unmarked_durations.items() if d > UNMARKED_LIMIT_S), reverse=True)
    if over:
        terminalreporter.section(f"tests over {UNMARKED_LIMIT_S:g} s not marked slow (mark them, or make them faster)")
        for duration, nodeid in over:
            terminalreporter.write_line(f"{duration:7.1f} s  {nodeid}")
