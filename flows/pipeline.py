"""The full pipeline as one flow: ingest a corpus, detect its entities, then sweep the mechanisms.
Each stage is reused when its inputs are unchanged (content keys), so a rerun with other entity
categories or epsilons goes straight to training."""

from __future__ import annotations

from dataclasses import dataclass

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field, model_validator

from uedp.detection.pipeline import DetectorConfig
from uedp.flows.detect import ScaleOut, detect_flow
from uedp.flows.ingest import IngestConfig, ingest_flow
from uedp.flows.sweep import SweepConfig, SweepOutcome, sweep_flow
from uedp.services.detect import DetectResult
from uedp.storage.ingest import IngestResult


class PipelineConfig(BaseModel):
    """Parameters of the full pipeline; the Prefect UI renders the three parts as nested forms."""

    model_config = ConfigDict(extra="forbid")

    ingest: IngestConfig = Field(description="the corpus files and how to read them")
    detector: DetectorConfig = Field(default_factory=DetectorConfig, description="which detectors find the entities")
    scale_out: ScaleOut = Field(default_factory=ScaleOut, description="detection shards and their task runner")
    sweep: SweepConfig = Field(description="the mechanisms, category sets, epsilons and seeds to train")
    store: str | None = Field(None, description="fsspec URL of the shared table store (s3://bucket/uedp) for "
                                                "every stage; empty: the data home only")

    @model_validator(mode="after")
    def _same_dataset(self) -> PipelineConfig:
        if (self.ingest.home, self.ingest.dataset) != (self.sweep.home, self.sweep.dataset):
            raise ValueError("ingest and sweep must name the same home and dataset")
        return self


@dataclass(frozen=True)
class PipelineOutcome:
    ingest: IngestResult
    detect: DetectResult
    sweep: SweepOutcome


@flow(name="uedp-pipeline", flow_run_name="pipeline-{config.ingest.dataset}")
def pipeline_flow(config: PipelineConfig) -> PipelineOutcome:
    """Ingest, detect and sweep in one run; each stage is reused when its inputs are unchanged.

    Args:
        config: the ingest, detection and sweep parts, and the table store they share.
    """
    store = {"store": config.store} if config.store else {}
    ingested = ingest_flow(config.ingest.model_copy(update=store))
    detected = detect_flow(config.ingest.dataset, config.detector, home=config.ingest.home,
                           scale_out=config.scale_out.model_copy(update=store))
    return PipelineOutcome(ingested, detected, sweep_flow(config.sweep.model_copy(update=store)))
