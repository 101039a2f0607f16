"""Report task: a thin Prefect wrapper over :mod:`uedp.services.report` (the sweep's privacy-utility report)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from uedp.services.report import summarise, write_report
from uedp.services.tracking import RunTracker
from uedp.services.training import TrainResult
from uedp.storage.home import DataHome


@task(name="privacy-utility-report", cache_policy=NO_CACHE)
def report_task(home: DataHome, dataset: str, outcomes: list[tuple[TrainResult, float | None]],
                parent_run_id: str, title: str) -> list[Path]:
    """Write the report to ``<home>/reports/<dataset>/<parent run>/`` and log it under the parent's ``report/``."""
    files = write_report(summarise(outcomes), home.reports_dir(dataset) / parent_run_id, title)
    parent = RunTracker.attach(home, parent_run_id)
    for path in files:
        parent.log_file(path, "report")
    return files
