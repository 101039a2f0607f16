"""Detection tasks: thin Prefect wrappers over :mod:`uedp.services.detect` (one pass, or shards a Dask or
Ray task runner spreads over processes and machines, then a merge), each logging its counts."""

from __future__ import annotations

from prefect import get_run_logger

from uedp.detection.pipeline import DetectorConfig
from uedp.services.detect import DetectResult, Shard, detect_entities, detect_shard, merge_shards
from uedp.storage.home import DataHome
from uedp.tasks.retry import retried_task


@retried_task("detect-entities")
def detect_task(home: DataHome, dataset: str, config: DetectorConfig | None = None,
                progress: bool = False, store_url: str | None = None) -> DetectResult:
    result = detect_entities(home, dataset, config, progress, store_url)
    _log(result, dataset)
    return result


@retried_task("detect-shard", task_run_name="detect-shard-{shard.index}")
def detect_shard_task(home: DataHome, dataset: str, config: DetectorConfig, shard: Shard,
                      store_url: str | None = None) -> int:
    return detect_shard(home, dataset, config, shard, store_url)


@retried_task("merge-entity-shards")
def merge_shards_task(home: DataHome, dataset: str, config: DetectorConfig, shards: list[Shard],
                      store_url: str | None = None) -> DetectResult:
    result = merge_shards(home, dataset, config, shards, store_url)
    _log(result, dataset)
    return result


def _log(result: DetectResult, dataset: str) -> None:
    # Counts only: entity text never goes to logs.
    get_run_logger().info("%s %d entity spans (%s, %d shard%s) for dataset %r", "reusing" if result.reused else "detected",
                          result.entities, result.detector, result.shards, "" if result.shards == 1 else "s", dataset)
