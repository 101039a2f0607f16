"""Ingest as a service: corpus files (local paths or fsspec URLs, copied under ``<home>/inputs`` first) into
a dataset's sentences and users tables, pulled from and published to a table store when there is one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from uedp.storage.home import DataHome
from uedp.storage.ingest import IngestOptions, IngestResult, ingest
from uedp.storage.remote import fetch_inputs, open_store


def ingest_files(home: DataHome, dataset: str, files: Sequence[str | Path], options: IngestOptions,
                 progress: bool = False, store_url: str | None = None) -> IngestResult:
    """Tables another machine already built from the same inputs come back from the store instead of being redone."""
    store = open_store(store_url)
    if store:
        store.pull(home, dataset, "sentences")
        store.pull(home, dataset, "users")
    local = fetch_inputs([str(f) for f in files], home.inputs_dir(dataset))
    result = ingest(home, dataset, local, options, progress=progress)
    if store:
        for table in ("sentences", "users"):
            store.push(home, dataset, table)
    return result
