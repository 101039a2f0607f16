"""Train task: one configuration, in this process or under torchrun, as a thin Prefect task.

A configuration that crashed resumes from its last checkpoint on the next call with the same
configuration: weights and accountant come back, and the same MLflow run continues.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from prefect import get_run_logger

from uedp.errors import UedpError
from uedp.storage.home import DataHome
from uedp.storage.remote import TableStore, open_store
from uedp.tasks.attack import attack_run
from uedp.tasks.config import TrainConfig
from uedp.tasks.retry import retried_task
from uedp.tasks.torchrun import train_with_torchrun
from uedp.tasks.training import (
    TrainResult,
    build_mechanism,
    loss_function,
    planned_population,
    sanitize_config,
    sanitize_for,
    train_configuration,
)

__all__ = ["TrainResult", "build_mechanism", "check_before_training", "loss_function", "planned_population", "run_training",
           "train_configuration", "train_task"]


def check_before_training(configs: list[TrainConfig], device: str) -> None:
    """Fail on bad settings before any work starts: the device, and the calibration of each target epsilon
    where it does not depend on the data (mechanisms that count no units of their own): a target that is
    out of reach is a configuration error found in seconds, not after the sweep's other trainings."""
    from uedp.models.device import resolve_device

    resolve_device(device)
    for config in configs:
        if config.spec.private and config.params.budget is not None and config.spec.early_calibration:
            build_mechanism(config, planned_population(config), n_examples=0)


def run_training(home: DataHome, config: TrainConfig, flow_run_id: str | None = None,
                 parent_run_id: str | None = None, store_url: str | None = None,
                 report_to: Callable[[str], Any] | None = None) -> TrainResult:
    """Train one configuration: in this process, or under ``torchrun`` when it asks for several processes;
    with a table store, the dataset's tables come from there first (this worker may be another machine)."""
    store = open_store(store_url)
    if store:
        store.pull_required(home, config.dataset, ("sentences", "users"))
        store.pull(home, config.dataset, "entities")
    if config.spec.text == "sanitized" and (store or config.processes > 1):
        # drawn once, here: every rank and every machine then reuses this release (in one process
        # without a store, the training draws or reuses it itself)
        share_release(home, config, store)
    if config.processes > 1:
        return train_with_torchrun(home, config, flow_run_id, parent_run_id)
    result = train_configuration(home, config, flow_run_id, parent_run_id, report_to=report_to)
    return with_audit(home, config, result) if config.audit_canaries else result


def share_release(home: DataHome, config: TrainConfig, store: TableStore | None) -> None:
    """The local-DP release this configuration trains on, drawn once across machines: with a table store,
    the store's release if it has one (pulled), else one drawn here and pushed, so a training on another
    machine reuses it instead of drawing its own (two draws of the same text would compose). Two machines
    that draw the same release at the same moment still draw twice: sanitize first (`uedp sanitize`, or
    one training) where trainings of a release run side by side."""
    name = sanitize_config(config).output_name
    if store:
        for table in RELEASE_TABLES:
            store.pull(home, name, table)
    release = sanitize_for(home, config)
    if store and not release.reused:
        for table in RELEASE_TABLES:
            store.push(home, name, table)  # data and manifest only: the draws stay in this home


RELEASE_TABLES = ("sentences", "users", "entities")


def with_audit(home: DataHome, config: TrainConfig, result: TrainResult) -> TrainResult:
    """Score the run's audit canaries right away (``uedp attack --kind audit``, logged to the run), so the
    bound sits next to the accounted epsilon wherever the result is shown.

    The run stands if the audit fails, whatever the error: this runs inside the retried train task, and a
    retry after a finished run would train (and release) a second model of the same data."""
    try:
        outcome = attack_run(home, result.run_id, ["audit"], device_name=config.device)
        failure = outcome.failed.get("audit")
    except Exception as exc:  # see above: never let it reach the retry
        failure = str(exc) if isinstance(exc, UedpError) else f"{type(exc).__name__}: {exc}"
    if failure is not None:
        return replace(result, notes="; ".join(filter(None, [result.notes, f"audit failed: {failure}"])))
    return replace(result, audit_epsilon=outcome.metrics.get("audit_one_run_epsilon_lower_bound"))


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
