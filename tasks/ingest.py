"""Ingest task: corpus files into the dataset's sentences and users tables (reused when unchanged)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prefect import get_run_logger

from uedp.storage.home import DataHome
from uedp.storage.ingest import IngestOptions, IngestResult, conll_options, ingest
from uedp.storage.remote import fetch_inputs, open_store
from uedp.tasks.retry import retried_task

__all__ = ["conll_options", "ingest_task"]


@retried_task("ingest-corpus")
def ingest_task(home: DataHome, dataset: str, files: Sequence[str | Path], options: IngestOptions,
                progress: bool = False, store_url: str | None = None) -> IngestResult:
    """Ingest local files or fsspec URLs (copied under ``<home>/inputs`` first); publish to the store."""
    store = open_store(store_url)
    if store:  # tables another machine already built from the same inputs come back instead of being redone
        store.pull(home, dataset, "sentences")
        store.pull(home, dataset, "users")
    local = fetch_inputs([str(f) for f in files], home.root / "inputs" / dataset)
    result = ingest(home, dataset, local, options, progress=progress)
    if store:
        for table in ("sentences", "users"):
            store.push(home, dataset, table)
    logger = get_run_logger()
    logger.info(
        "%s dataset %r (%s): %d sentences, %d users%s", "reusing" if result.reused else "ingested", dataset,
        options.format, result.sentences, result.users, " (inputs unchanged)" if result.reused else "",
    )
    if result.warning:
        logger.warning(result.warning)
    return result
