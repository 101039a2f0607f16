"""``uedp demo``: ingest the bundled corpus, detect entities, train each mechanism, log to MLflow."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from prefect import flow, runtime
from pydantic import BaseModel, ConfigDict, Field, model_validator

from uedp.detection.categories import Categories, default_categories
from uedp.detection.pipeline import DetectorConfig
from uedp.storage.home import DataHome
from uedp.storage.ingest import IngestResult
from uedp.tasks.config import RANDOMNESS_HELP, MechanismName, MechanismSettings, TrainConfig, nest_flat
from uedp.tasks.detect import DetectResult, detect_task
from uedp.tasks.ingest import conll_options, ingest_task
from uedp.tasks.train import TrainResult, train_task

DEMO_CORPUS = Path(str(files("uedp") / "data" / "demo.conll"))


class DemoConfig(BaseModel):
    """Parameters of the demo flow; the Prefect UI renders these as a form. Mechanism parameters may be
    given flat (``DemoConfig(home=..., q_user=0.2)``)."""

    model_config = ConfigDict(extra="forbid")

    home: str = Field(description="data home (datasets, MLflow store)")
    dataset: str = "demo"
    mechanisms: list[MechanismName] = Field(default_factory=lambda: ["noiseless", "deid", "userdp", "uedp"])
    categories: Categories = Field(default_factory=default_categories, validate_default=True)
    seed: int = 0
    # Seeded, so the demo's table is reproducible; its runs are tagged and their statements say the
    # guarantee does not hold against anyone who knows the seed.
    randomness: Literal["secure", "seeded"] = Field("seeded", description=RANDOMNESS_HELP)
    device: str = "auto"
    settings: MechanismSettings = Field(default_factory=MechanismSettings,
                                        description="mechanism parameters (each mechanism takes the ones it knows)")

    @model_validator(mode="before")
    @classmethod
    def _flat_form(cls, data: Any) -> Any:
        return nest_flat(data, set(cls.model_fields), "settings") if isinstance(data, dict) else data

    def train_configs(self) -> list[TrainConfig]:
        settings = self.settings.model_dump()
        if settings.get("target_epsilon") is not None:
            settings["noise_multiplier"] = None
        return [TrainConfig.for_mechanism(mechanism, **settings, dataset=self.dataset, categories=self.categories,
                                          seed=self.seed, device=self.device, randomness=self.randomness)
                for mechanism in self.mechanisms]


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
