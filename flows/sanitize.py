"""``uedp sanitize`` as a flow: one local-DP release of a dataset's train split (CusText or SanText)
into a new dataset, which the sweep then trains like any other."""

from __future__ import annotations

from prefect import flow

from uedp.storage.home import DataHome
from uedp.tasks.sanitize import SanitizeConfig, SanitizeResult, sanitize_task


@flow(name="uedp-sanitize", flow_run_name="sanitize-{config.dataset}")
def sanitize_flow(config: SanitizeConfig, home: str = "", progress: bool = False) -> SanitizeResult:
    """``home`` empty: the data home `uedp serve` was given (``UEDP_HOME``), else ./.uedp."""
    return sanitize_task(DataHome.from_env(home or None), config, progress)
