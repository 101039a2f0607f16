"""``uedp detect``: find sensitive entities in every sentence of a dataset."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from detection.pipeline import DetectorConfig
from storage.home import DataHome
from tasks.detect import DetectResult, detect_task


@flow(name="uedp-detect")
def detect_flow(home: str, dataset: str, detector: DetectorConfig, progress: bool = False) -> DetectResult:
    return detect_task(DataHome(Path(home)), dataset, detector, progress)
