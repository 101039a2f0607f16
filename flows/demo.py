"""``uedp demo``: ingest the bundled corpus, detect entities, train each mechanism, log to MLflow."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Literal

from prefect import flow, runtime
from pydantic import BaseModel, ConfigDict, Field

from uedp.detection.categories import Categories
from uedp.detection.pipeline import DetectorConfig
from uedp.storage.home import DataHome
from uedp.storage.ingest import IngestResult
from uedp.tasks.config import FEDERATED, RANDOMNESS_HELP, MechanismName, TrainConfig
from uedp.tasks.detect import DetectResult, detect_task
from uedp.tasks.ingest import conll_options, ingest_task
from uedp.tasks.train import TrainResult, train_task

DEMO_CORPUS = Path(str(files("uedp") / "data" / "demo.conll"))


class DemoConfig(BaseModel):
    """Parameters of the demo flow; the Prefect UI renders these as a form."""

    model_config = ConfigDict(extra="forbid")

    home: str = Field(description="data home (datasets, MLflow store)")
    dataset: str = "demo"
    mechanisms: list[MechanismName] = Field(default_factory=lambda: ["noiseless", "deid", "userdp", "uedp"])
    categories: Categories = Field(default_factory=lambda: ["PERSON", "LOC", "ORG", "PHONE_NUMBER", "EMAIL_ADDRESS"],
                                  validate_default=True)
    steps: int = Field(300, ge=1, description="optimizer steps of noiseless, deid and dpsgd")
    rounds: int = Field(30, ge=1, description="DP-FedAvg rounds of userdp and uedp")
    q_user: float = Field(0.5, gt=0, le=1)
    q_entity: float = Field(0.5, gt=0, le=1)
    q_extended: float = Field(0.5, gt=0, le=1)
    noise_multiplier: float | None = Field(1.0, gt=0)
    target_epsilon: float | None = Field(None, gt=0)
    clip: float = Field(1.0, gt=0)
    seed: int = 0
    # Seeded, so the demo's table is reproducible; its runs are tagged and their statements say the
    # guarantee does not hold against anyone who knows the seed.
    randomness: Literal["secure", "seeded"] = Field("seeded", description=RANDOMNESS_HELP)
    device: str = "auto"

    def train_configs(self) -> list[TrainConfig]:
        configs = []
        for mechanism in self.mechanisms:
            configs.append(
                TrainConfig(
                    dataset=self.dataset, mechanism=mechanism, categories=self.categories,
                    steps=self.rounds if mechanism in FEDERATED else self.steps, q_user=self.q_user, q_entity=self.q_entity,
                    q_extended=self.q_extended,
                    noise_multiplier=None if self.target_epsilon else self.noise_multiplier,
                    target_epsilon=self.target_epsilon, clip=self.clip, seed=self.seed, device=self.device,
                    randomness=self.randomness,
                )
            )
        return configs


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
