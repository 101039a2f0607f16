"""``uedp demo``: ingest the bundled corpus, detect entities, train each mechanism, log to MLflow."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import flow, runtime

from uedp.detection.pipeline import DetectorConfig
from uedp.services.config import DemoConfig
from uedp.services.detect import DetectResult
from uedp.services.training import TrainResult
from uedp.storage.home import DataHome
from uedp.storage.ingest import IngestResult
from uedp.storage.remote import bundled_file
from uedp.tasks.detect import detect_task
from uedp.tasks.ingest import conll_options, ingest_task
from uedp.tasks.train import train_task

DEMO_CORPUS = bundled_file("demo.conll")
__all__ = ["DEMO_CORPUS", "DemoConfig", "DemoOutcome", "demo_flow"]


@dataclass(frozen=True)
class DemoOutcome:
    ingest: IngestResult
    detect: DetectResult
    runs: list[TrainResult]


@flow(name="uedp-demo")
def demo_flow(config: DemoConfig) -> DemoOutcome:
    """Ingest the bundled corpus, detect its gold entities, train each mechanism and log it to MLflow.

    Args:
        config: the mechanisms, the sensitive categories, the seed and the mechanism settings.
    """
    home = DataHome.from_env(config.home or None)
    ingest = ingest_task(home, config.dataset, [DEMO_CORPUS], conll_options(split_seed=config.seed))
    detect = detect_task(home, config.dataset, DetectorConfig(detectors=["gold"]))
    flow_run_id = str(runtime.flow_run.id or "")
    runs = [train_task(home, train_config, flow_run_id) for train_config in config.train_configs()]
    return DemoOutcome(ingest, detect, runs)
