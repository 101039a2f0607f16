"""``uedp sweep``: one training task per configuration of the sweep's grid on a dataset that has been
ingested and detected, each logged as an MLflow run nested under one parent run, followed by the
privacy-utility report (PNG + Markdown) on the parent run and on disk.

A configuration that fails does not stop the others; the sweep reports it and ends failed after
writing the report of the rest.
"""

from __future__ import annotations

import sys
import traceback

from prefect import flow, get_run_logger, runtime

from uedp.services.finished_runs import finished_result
from uedp.services.launch import preflight_sweep
from uedp.services.sweep import Failure, SweepOutcome, SweepProgress, SweepRun
from uedp.services.sweep_config import SweepConfig
from uedp.storage.home import DataHome
from uedp.tasks.report import report_task
from uedp.tasks.train import train_task

__all__ = ["SweepConfig", "SweepOutcome", "sweep_flow"]


@flow(name="uedp-sweep", flow_run_name="sweep-{config.dataset}")
def sweep_flow(config: SweepConfig, progress: bool = False) -> SweepOutcome:
    """Train every configuration of the grid, one MLflow run each under a parent run, then the report.

    Args:
        config: the grid (mechanisms, category sets, target epsilons, seeds) and the shared settings.
        progress: the [k/N] lines on stderr too (the CLI), besides the flow run's log.
    """
    home = DataHome.from_env(config.home or None)
    logger = get_run_logger()
    # before the parent MLflow run: a typo is not a failed sweep; what it cannot plan yet is said in the log
    items = preflight_sweep(home, config, say=lambda line: logger.info("%s", line))
    flow_run_id = str(runtime.flow_run.id or "")
    sweep = SweepRun.open(home, config, items, flow_run_id)
    logger.info("sweep: %d configurations, parent MLflow run %s", len(items), sweep.run_id)

    def say(line: str) -> None:
        (logger.error if "FAILED" in line else logger.info)(line)
        if progress:
            print(line, file=sys.stderr, flush=True)

    tally = SweepProgress(len(items), say)
    try:
        # One at a time: trainings on one machine would compete for its one GPU (deployments add a
        # concurrency limit on the "uedp-train" tag for work pools with several workers).
        for index, item in enumerate(items, start=1):
            if config.reuse_finished and (done := finished_result(home, item.config)) is not None:
                sweep.record(item, done)
                tally.reused(index, item, done)
                continue
            tally.starting(index, item)
            state = train_task.with_options(tags=["uedp-train"])(home, item.config, flow_run_id, sweep.run_id,
                                                                 config.store, console=progress, return_state=True)
            if state.is_completed():
                result, failure = state.result(), None
            else:
                try:
                    raised = state.result(raise_on_failure=False)
                except Exception as exc:  # a crashed task may have no result to read back
                    raised = exc
                if isinstance(raised, BaseException):
                    # The traceback's frames hold the failed training's objects (DuckDB connections, models)
                    # until the process exits; only the cause is kept.
                    traceback.clear_frames(raised.__traceback__)
                result, failure = None, Failure.of(item.config.run_name(),
                                                   raised if isinstance(raised, BaseException) else None)
            sweep.record(item, result, failure)
            tally.ended_with(index, item, result, failure)
        title = f"uedp sweep on {config.dataset} ({config.run.model} {config.run.model_size})"
        files = report_task(home, config.dataset, sweep.finished, sweep.run_id, title) if sweep.finished else []
    except BaseException:
        sweep.abort()
        raise
    return sweep.finish([str(f) for f in files])
