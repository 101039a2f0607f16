"""Detection task: sentences into the entities table, cached by (corpus content, detector config, taxonomy)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from tqdm.auto import tqdm

from detection.categories import taxonomy
from detection.pipeline import DetectorConfig, detect
from storage.home import DataHome
from storage.schemas import ENTITIES
from storage.tables import DATA_FILE, TableWriter, hash_config, is_current, read_manifest
from tasks.retry import RETRIES, transient_only
from uedp.errors import UedpError

COLUMNS = ["sentence_id", "user_id", "text", "gold_spans"]


@dataclass(frozen=True)
class DetectResult:
    dataset: str
    detector: str
    reused: bool
    entities: int


def detect_entities(home: DataHome, dataset: str, config: DetectorConfig | None = None,
                    progress: bool = False) -> DetectResult:
    """Write the dataset's entities table, unless one built from the same content and config exists."""
    config = config or DetectorConfig()
    sentences_dir = home.table_dir(dataset, "sentences")
    sentences = read_manifest(sentences_dir)
    if sentences is None:
        raise UedpError(f"dataset {dataset!r} has no sentences table under {home.dataset_dir(dataset)}; ingest it first")
    tax = taxonomy()
    key = hash_config({"sentences": sentences["key"], "detector": config.identity(),
                       "taxonomy": hashlib.sha256(Path(tax.source).read_bytes()).hexdigest()})
    entities_dir = home.table_dir(dataset, "entities")
    name = "+".join(config.detectors)
    if is_current(entities_dir, key):
        return DetectResult(dataset, name, True, int(read_manifest(entities_dir)["rows"]))  # type: ignore[index]
    parquet = pq.ParquetFile(sentences_dir / DATA_FILE)
    bar = tqdm(total=parquet.metadata.num_rows, desc=f"detect {dataset}", unit=" sentences", disable=not progress,
               mininterval=0.5)

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in parquet.iter_batches(batch_size=2_000, columns=COLUMNS):
            yield batch
            bar.update(batch.num_rows)

    details = {"detector": config.model_dump(exclude={"batch_size", "workers"}), "taxonomy": tax.source}
    with TableWriter(entities_dir, ENTITIES, key, details) as writer:
        for rows in detect(batches(), config, tax):
            writer.write_rows(rows)
    bar.close()
    return DetectResult(dataset, name, False, writer.rows)


@task(name="detect-entities", cache_policy=NO_CACHE, retry_condition_fn=transient_only, **RETRIES)
def detect_task(home: DataHome, dataset: str, config: DetectorConfig | None = None,
                progress: bool = False) -> DetectResult:
    result = detect_entities(home, dataset, config, progress)
    # Counts only: entity text never goes to logs.
    get_run_logger().info("%s %d entity spans (%s) for dataset %r", "reusing" if result.reused else "detected",
                          result.entities, result.detector, dataset)
    return result
