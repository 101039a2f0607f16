"""Synthetic-text tasks: thin Prefect wrappers over :mod:`uedp.services.synthetic` (the corpus) and
:mod:`uedp.services.synthetic_measures` (its utility and leakage)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger

from uedp.services.synthetic import GenerateConfig, GenerateResult, generate_dataset
from uedp.services.synthetic_accuracy import AccuracyFigures, measure_accuracy
from uedp.services.synthetic_measures import (
    FidelityFigures,
    UtilityFigures,
    measure_fidelity,
    measure_leakage,
    measure_utility,
    measures_file,
)
from uedp.storage.home import DataHome
from uedp.tasks.retry import retried_task


@retried_task("generate-corpus", task_run_name="generate-{config.run_id}")
def generate_task(home: DataHome, config: GenerateConfig, progress: bool = False) -> GenerateResult:
    logger = get_run_logger()
    result = generate_dataset(home, config, progress, say=logger.info if progress else logger.warning)
    # Settings and the run's stated guarantee only: no generated text goes to the logs.
    logger.info("%s %s: %d texts by %d made-up writers; %s", "reused" if result.reused else "wrote", result.dataset,
                result.texts, result.writers, result.guarantee)
    return result


@retried_task("synthetic-utility", task_run_name="utility-{dataset}")
def utility_task(home: DataHome, dataset: str, steps: int, device: str = "auto",
                 progress: bool = False) -> UtilityFigures:
    logger = get_run_logger()
    figures = measure_utility(home, dataset, steps=steps, device=device, progress=progress, report_to=logger.info)
    logger.info("%s", figures.line())
    return figures


@retried_task("synthetic-accuracy", task_run_name="accuracy-{dataset}")
def accuracy_task(home: DataHome, dataset: str, steps: int, device: str = "auto",
                  progress: bool = False) -> AccuracyFigures:
    logger = get_run_logger()
    figures = measure_accuracy(home, dataset, steps=steps, device=device, progress=progress, report_to=logger.info)
    logger.info("%s", figures.line())
    return figures


@retried_task("synthetic-fidelity", task_run_name="fidelity-{dataset}")
def fidelity_task(home: DataHome, dataset: str, encoder: str, device: str = "auto") -> FidelityFigures:
    figures = measure_fidelity(home, dataset, Path(encoder), device)
    get_run_logger().info("%s", figures.line())
    return figures


@retried_task("synthetic-leakage", task_run_name="leakage-{dataset}")
def leakage_task(home: DataHome, dataset: str, source_dataset: str, reference: str | None = None,
                 utility_run: str | None = None, device: str = "auto") -> str:
    """The leakage figures go to a file in the data home, never to the flow's log or result: they are
    computed against the private text (docs/PRIVACY.md). Returns the file's path."""
    measure_leakage(home, dataset, reference=reference, utility_run=utility_run, device_name=device)
    where = measures_file(home, source_dataset, dataset)
    get_run_logger().info("leakage figures of %s (computed against the private text) are in %s", dataset, where)
    return str(where)
