"""``uedp demo``: ingest the bundled corpus, detect entities, train each mechanism, log to MLflow."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from prefect import flow, runtime

from uedp.detection.pipeline import DetectorConfig
from uedp.services.demo_config import DemoConfig
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
def demo_flow(config: DemoConfig, progress: bool = False) -> DemoOutcome:
    """Ingest the bundled corpus, detect its gold entities, train each mechanism and log it to MLflow.

    Args:
        config: the mechanisms, the sensitive categories, the seed and the mechanism settings.
        progress: each step and each training's progress on stderr as it happens (the CLI), besides the
            flow run's log.
    """
    home = DataHome.from_env(config.home or None)

    def say(line: str) -> None:
        if progress:
            print(line, file=sys.stderr, flush=True)

    ingest = ingest_task(home, config.dataset, [DEMO_CORPUS], conll_options(split_seed=config.seed))
    say(f"ingest: {ingest.sentences} sentences, {ingest.users} users" + (" (reused)" if ingest.reused else ""))
    detect = detect_task(home, config.dataset, DetectorConfig(detectors=["gold"]))
    say(f"detect: {detect.entities} {detect.detector} entity spans" + (" (reused)" if detect.reused else ""))
    flow_run_id = str(runtime.flow_run.id or "")
    configs = config.train_configs()
    runs = []
    for index, train_config in enumerate(configs, start=1):
        say(f"[{index}/{len(configs)}] {train_config.run_name()}: training")
        runs.append(train_task(home, train_config, flow_run_id, console=progress))
    return DemoOutcome(ingest, detect, runs)
