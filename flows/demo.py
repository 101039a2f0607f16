"""``uedp demo``: ingest the bundled corpus, detect entities, train each mechanism, log to MLflow."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from prefect import flow, runtime

from uedp.detection.pipeline import DetectorConfig
from uedp.storage.home import DataHome
from uedp.storage.ingest import IngestResult
from uedp.tasks.config import DemoConfig
from uedp.tasks.detect import DetectResult, detect_task
from uedp.tasks.ingest import conll_options, ingest_task
from uedp.tasks.train import TrainResult, train_task

DEMO_CORPUS = Path(str(files("uedp") / "data" / "demo.conll"))
__all__ = ["DEMO_CORPUS", "DemoConfig", "DemoOutcome", "demo_flow"]


@dataclass(frozen=True)
class DemoOutcome:
    ingest: IngestResult
    detect: DetectResult
    runs: list[TrainResult]


@flow(name="uedp-demo")
def demo_flow(config: DemoConfig) -> DemoOutcome:
    home = DataHome(Path(config.home))
    ingest = ingest_task(home, config.dataset, [DEMO_CORPUS], conll_options(split_seed=config.seed))
    detect = detect_task(home, config.dataset, DetectorConfig(detectors=["gold"]))
    flow_run_id = str(runtime.flow_run.id or "")
    runs = [train_task(home, train_config, flow_run_id) for train_config in config.train_configs()]
    return DemoOutcome(ingest, detect, runs)
