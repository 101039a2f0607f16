"""Train task: one configuration, as a thin Prefect task over :func:`uedp.services.launch.run_training`
(in this process or under torchrun; a crashed configuration resumes from its last checkpoint in the same
MLflow run on the next call with the same configuration)."""

from __future__ import annotations

import math

from prefect import get_run_logger

from uedp.services.config import TrainConfig
from uedp.services.launch import run_training
from uedp.services.training import TrainResult
from uedp.storage.home import DataHome
from uedp.tasks.retry import retried_task

__all__ = ["TrainResult", "train_task"]


@retried_task("train-configuration", task_run_name="train-{config.mechanism}")
def train_task(home: DataHome, config: TrainConfig, flow_run_id: str | None = None,
               parent_run_id: str | None = None, store_url: str | None = None, console: bool = False) -> TrainResult:
    """``console``: progress on this process's terminal (a flow the CLI runs); else progress lines in the
    flow run's log (the Prefect UI), a line per tenth of the rounds."""
    report_to = None if console else get_run_logger().info
    result = run_training(home, config, flow_run_id, parent_run_id, store_url, report_to=report_to)
    get_run_logger().info(
        "%s: epsilon=%s %s(test)=%.4g run_id=%s%s", config.run_name(),
        "inf" if math.isinf(result.epsilon) else f"{result.epsilon:.3g}", result.utility_metric, result.utility_test,
        result.run_id, f" (resumed after round {result.resumed_from})" if result.resumed_from else "",
    )
    return result
