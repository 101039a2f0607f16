"""Ingest task: a thin Prefect wrapper over :func:`uedp.services.ingest.ingest_files` that logs the counts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from prefect import get_run_logger

from uedp.services.ingest import ingest_files
from uedp.services.public_datasets import apply_declaration
from uedp.storage.home import DataHome
from uedp.storage.ingest import IngestOptions, IngestResult, conll_options
from uedp.tasks.retry import retried_task

__all__ = ["conll_options", "ingest_task"]


@retried_task("ingest-corpus")
def ingest_task(home: DataHome, dataset: str, files: Sequence[str | Path], options: IngestOptions,
                progress: bool = False, store_url: str | None = None, public: str | None = None) -> IngestResult:
    """Ingest local files or fsspec URLs (copied under ``<home>/inputs`` first); publish to the store. ``public``:
    why the text is public, to declare it so (None: a private dataset, withdrawing an earlier declaration)."""
    result = ingest_files(home, dataset, files, options, progress, store_url)
    result = replace(result, public=apply_declaration(home, dataset, public))
    logger = get_run_logger()
    logger.info(
        "%s dataset %r (%s): %d sentences, %d users%s", "reusing" if result.reused else "ingested", dataset,
        options.format, result.sentences, result.users, " (inputs unchanged)" if result.reused else "",
    )
    if result.public:
        logger.info(result.public)
    if result.warning:
        logger.warning(result.warning)
    return result
