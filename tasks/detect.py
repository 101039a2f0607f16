"""Detection task: sentences into the entities table, cached by (corpus content, detector config)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.parquet as pq
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from detection.gold import gold_entities
from storage.home import DataHome
from storage.schemas import ENTITIES
from storage.tables import DATA_FILE, TableWriter, hash_config, is_current, read_manifest
from uedp.errors import UedpError

DETECTORS = ("gold",)


@dataclass(frozen=True)
class DetectResult:
    dataset: str
    detector: str
    reused: bool
    entities: int


def detect_entities(home: DataHome, dataset: str, detector: str = "gold") -> DetectResult:
    if detector not in DETECTORS:
        raise UedpError(f"unknown detector {detector!r}; valid: {', '.join(DETECTORS)}")
    sentences_dir = home.table_dir(dataset, "sentences")
    sentences = read_manifest(sentences_dir)
    if sentences is None:
        raise UedpError(f"dataset {dataset!r} has no sentences table under {home.dataset_dir(dataset)}; ingest it first")
    key = hash_config({"sentences": sentences["key"], "detector": {"name": detector}})
    entities_dir = home.table_dir(dataset, "entities")
    if is_current(entities_dir, key):
        return DetectResult(dataset, detector, True, int(read_manifest(entities_dir)["rows"]))  # type: ignore[index]
    parquet = pq.ParquetFile(sentences_dir / DATA_FILE)
    columns = ["sentence_id", "user_id", "text", "gold_spans"]
    with TableWriter(entities_dir, ENTITIES, key, {"detector": {"name": detector}}) as writer:
        for rows in gold_entities(parquet.iter_batches(batch_size=10_000, columns=columns)):
            writer.write_rows(rows)
    return DetectResult(dataset, detector, False, writer.rows)


@task(name="detect-entities", cache_policy=NO_CACHE)
def detect_task(home: DataHome, dataset: str, detector: str = "gold") -> DetectResult:
    result = detect_entities(home, dataset, detector)
    get_run_logger().info(
        "%s %d %s entities for dataset %r", "reusing" if result.reused else "detected", result.entities,
        detector, dataset,
    )
    return result
