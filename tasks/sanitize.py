"""Sanitize task: a thin Prefect wrapper over :func:`uedp.services.sanitize.sanitize_dataset`."""

from __future__ import annotations

from prefect import get_run_logger

from uedp.services.sanitize import SanitizeResult, sanitize_dataset
from uedp.services.sanitize_config import SanitizeConfig
from uedp.storage.home import DataHome
from uedp.tasks.retry import retried_task


@retried_task("sanitize-dataset")
def sanitize_task(home: DataHome, config: SanitizeConfig, progress: bool = False) -> SanitizeResult:
    result = sanitize_dataset(home, config, progress)
    # Figures only: no text of either corpus goes to the logs.
    get_run_logger().info("%s %s: per-token epsilon %.4g, %.1f%% of train tokens unchanged", "reused" if result.reused
                          else "wrote", result.dataset, result.per_token_epsilon, 100 * result.unchanged_share)
    return result
