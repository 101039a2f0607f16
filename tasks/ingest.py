"""Ingest task: corpus files into the dataset's sentences and users tables (reused when unchanged)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from storage.home import DataHome
from storage.ingest import IngestOptions, IngestResult, conll_options, ingest
from tasks.retry import RETRIES, transient_only

__all__ = ["conll_options", "ingest_task"]


@task(name="ingest-corpus", cache_policy=NO_CACHE, retry_condition_fn=transient_only, **RETRIES)
def ingest_task(home: DataHome, dataset: str, files: list[Path], options: IngestOptions,
                progress: bool = False) -> IngestResult:
    result = ingest(home, dataset, files, options, progress=progress)
    get_run_logger().info(
        "%s dataset %r (%s): %d sentences, %d users%s", "reusing" if result.reused else "ingested", dataset,
        options.format, result.sentences, result.users, " (inputs unchanged)" if result.reused else "",
    )
    return result
