"""``uedp sanitize`` as a flow: one local-DP release of a dataset's train split (CusText or SanText)
into a new dataset, which the sweep then trains like any other."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from uedp.storage.home import DataHome
from uedp.tasks.sanitize import SanitizeConfig, SanitizeResult, sanitize_task


@flow(name="uedp-sanitize", flow_run_name="sanitize-{config.dataset}")
def sanitize_flow(home: str, config: SanitizeConfig, progress: bool = False) -> SanitizeResult:
    return sanitize_task(DataHome(Path(home)), config, progress)
