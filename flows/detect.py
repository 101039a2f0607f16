"""``uedp detect``: find sensitive entities in every sentence of a dataset.

One task by default. With ``scale_out.rows_per_shard`` the sentences are cut into row-range shards and
a subflow maps the shard task over them on a task runner: threads in this process, a local Dask
cluster of worker processes, or an existing Dask cluster (``dask_address``) whose workers may be
other machines; then one task merges the parts. The result equals the single pass's.
"""

from __future__ import annotations

from typing import Literal

from prefect import flow, unmapped
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from pydantic import BaseModel, ConfigDict, Field

from uedp.detection.pipeline import DetectorConfig
from uedp.services.detect import DetectResult, Shard, shards_to_detect
from uedp.storage.home import DataHome
from uedp.tasks.detect import detect_shard_task, detect_task, merge_shards_task


class ScaleOut(BaseModel):
    """How detection spreads over processes and machines; none of it changes the result."""

    model_config = ConfigDict(extra="forbid")

    rows_per_shard: int | None = Field(None, ge=1, description="cut the corpus into shards of this many sentences; "
                                                                "empty: one task")
    runner: Literal["threads", "dask"] = Field("dask", description="where shard tasks run")
    dask_address: str | None = Field(None, description="scheduler of an existing Dask cluster (tcp://host:8786); "
                                                       "empty: a local cluster of dask_workers processes")
    dask_workers: int = Field(2, ge=1, description="worker processes of the local Dask cluster")
    store: str | None = Field(None, description="fsspec URL of the shared table store (s3://bucket/uedp); "
                                                "needed when shards run on other machines")

    def task_runner(self) -> TaskRunner:
        if self.runner == "threads":
            return ThreadPoolTaskRunner(max_workers=self.dask_workers)
        from prefect_dask.task_runners import DaskTaskRunner

        if self.dask_address:
            return DaskTaskRunner(address=self.dask_address)
        # One thread per worker process: spaCy and Presidio hold the GIL, parallelism comes from processes.
        return DaskTaskRunner(cluster_kwargs={"n_workers": self.dask_workers, "threads_per_worker": 1,
                                              "processes": True})


@flow(name="uedp-detect-shards")
def detect_shards_flow(home: str, dataset: str, detector: DetectorConfig, shards: list[Shard],
                       store: str | None = None) -> DetectResult:
    """Map the shard task over the shards on this flow's task runner, then merge the parts."""
    data_home = DataHome.from_env(home or None)
    parts = detect_shard_task.map(unmapped(data_home), unmapped(dataset), unmapped(detector), shards, unmapped(store))
    parts.wait()  # every shard ends (finished parts stay staged for a rerun) before a failure is raised
    parts.result()  # raises the first failed shard's error, naming its input
    return merge_shards_task(data_home, dataset, detector, shards, store)


@flow(name="uedp-detect")
def detect_flow(dataset: str, detector: DetectorConfig, home: str = "", progress: bool = False,
                scale_out: ScaleOut | None = None) -> DetectResult:
    """Detect sensitive entities in every sentence into the dataset's entities table (reused when the
    sentences and the detector configuration are unchanged).

    Args:
        dataset: an ingested dataset of the data home.
        detector: which detectors, with which models and recognizers.
        home: the data home; empty: the one `uedp serve` was given (UEDP_HOME), else ./.uedp.
        progress: report progress on stderr (the worker's log), besides the flow run's log.
        scale_out: detection shards and the task runner that spreads them (empty: one task).
    """
    data_home = DataHome.from_env(home or None)
    scale_out = scale_out or ScaleOut()
    if scale_out.rows_per_shard is None:
        return detect_task(data_home, dataset, detector, progress, scale_out.store)
    shards = shards_to_detect(data_home, dataset, detector, scale_out.rows_per_shard, scale_out.store)
    if isinstance(shards, DetectResult):  # same corpus and detector configuration: nothing to do
        return shards
    sharded = detect_shards_flow.with_options(task_runner=scale_out.task_runner())  # type: ignore[arg-type]  # Prefect types runners by future kind
    # The resolved folder, not "": shard tasks may run in processes that do not share this environment.
    return sharded(str(data_home.root), dataset, detector, shards, scale_out.store)
