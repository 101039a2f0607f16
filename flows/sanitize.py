"""``uedp sanitize`` as a flow: one local-DP release of a dataset's train split (CusText or SanText)
into a new dataset, which the sweep then trains like any other."""

from __future__ import annotations

from prefect import flow

from uedp.services.sanitize import SanitizeResult
from uedp.services.sanitize_config import SanitizeConfig
from uedp.storage.home import DataHome
from uedp.tasks.sanitize import sanitize_task


@flow(name="uedp-sanitize", flow_run_name="sanitize-{config.dataset}")
def sanitize_flow(config: SanitizeConfig, home: str = "", progress: bool = False) -> SanitizeResult:
    """One local-DP release of a dataset's train split, as a new dataset (made once, then reused).

    Args:
        config: the dataset, the mechanism (CusText or SanText), its per-token epsilon and embeddings.
        home: the data home; empty: the one `uedp serve` was given (UEDP_HOME), else ./.uedp.
        progress: report progress on stderr (the worker's log), besides the flow run's log.
    """
    return sanitize_task(DataHome.from_env(home or None), config, progress)
