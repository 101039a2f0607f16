"""Ingest task: corpus files into the dataset's sentences and users tables (reused when unchanged)."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from storage.home import DataHome
from storage.ingest import IngestResult, SplitByUser, ingest_conll


@task(name="ingest-conll2003", cache_policy=NO_CACHE)
def ingest_conll_task(home: DataHome, dataset: str, files: list[Path], split_seed: int | None = None) -> IngestResult:
    splitter = SplitByUser(seed=split_seed) if split_seed is not None else None
    result = ingest_conll(home, dataset, files, splitter)
    verb = "reusing" if result.reused else "ingested"
    get_run_logger().info(
        "%s dataset %r: %d sentences, %d users%s", verb, dataset, result.sentences, result.users,
        " (inputs unchanged)" if result.reused else "",
    )
    return result
