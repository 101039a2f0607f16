"""``uedp sweep``: one training task per mechanism x entity categories x epsilon x seed on a dataset
that has been ingested and detected, each logged as an MLflow run nested under one parent run of the
sweep, followed by the privacy-utility report (PNG + Markdown) on the parent run and on disk.

Mechanisms without a guarantee run once per seed (``deid`` once per category set, ``noiseless`` once,
since categories do not change it). A configuration that fails does not stop the others; the sweep
reports it and ends failed after writing the report of the rest.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from prefect import flow, get_run_logger, runtime
from pydantic import BaseModel, ConfigDict, Field, model_validator

from uedp.detection.categories import Categories
from uedp.models.factory import ModelKind
from uedp.storage.home import DataHome
from uedp.tasks.config import FEDERATED, LOCAL_DP, RANDOMNESS_HELP, LocalDpSettings, MechanismName, TrainConfig
from uedp.tasks.report import report_task
from uedp.tasks.tracking import RunTracker
from uedp.tasks.train import TrainResult, train_task
from uedp.errors import UedpError


class SweepConfig(BaseModel):
    """Parameters of a sweep; the Prefect UI renders these as a form."""

    model_config = ConfigDict(extra="forbid")

    home: str = Field(description="data home (datasets, MLflow store)")
    dataset: str
    mechanisms: list[MechanismName] = Field(default_factory=lambda: ["noiseless", "userdp", "uedp"], min_length=1)
    category_sets: list[Categories] = Field(default_factory=lambda: [["PERSON", "LOC", "ORG"]], min_length=1,
                                            description="each entry is one set of sensitive categories")
    target_epsilons: list[float] = Field(default_factory=list,
                                         description="calibrate each private mechanism to each; empty: use noise_multiplier")
    noise_multiplier: float = Field(1.0, gt=0, description="used when no target epsilons are given")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    model: ModelKind = "gpt2"
    model_size: str = "tiny"
    steps: int = Field(300, ge=1, description="optimizer steps of noiseless, deid, dpsgd and selective")
    rounds: int = Field(30, ge=1, description="DP-FedAvg rounds of userdp, uedp and uedp-naive")
    public_steps: int = Field(300, ge=0, description="selective: noiseless steps on the redacted corpus")
    batch_size: int = Field(16, ge=1)
    lr: float = Field(1e-3, gt=0)
    q_user: float = Field(0.5, gt=0, le=1)
    q_entity: float = Field(0.5, gt=0, le=1)
    q_extended: float = Field(0.5, gt=0, le=1)
    clip: float = Field(1.0, gt=0)
    local_steps: int = Field(5, ge=1)
    local_lr: float = Field(0.5, gt=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    max_len: int = Field(96, ge=8)
    checkpoint_every: int = Field(25, ge=0)
    device: str = "auto"
    processes: int = Field(1, ge=1, description="torchrun processes per training (one per GPU of the worker)")
    local_dp: LocalDpSettings | None = Field(None, description="custext / santext: how the train split is "
                                                               "sanitized (each target epsilon is per token)")
    store: str | None = Field(None, description="fsspec URL of the shared table store (s3://bucket/uedp); "
                                                "empty: the data home only")
    randomness: Literal["secure", "seeded"] = Field("secure", description=RANDOMNESS_HELP)
    public_count: int | None = Field(None, ge=1, description="declare the number of privacy units public "
                                                             "(default: a DP count composed into epsilon)")

    @model_validator(mode="after")
    def _epsilons(self) -> "SweepConfig":
        if any(not (e > 0 and math.isfinite(e)) for e in self.target_epsilons):
            raise ValueError("target epsilons must be positive numbers")
        if set(self.mechanisms) & set(LOCAL_DP) and (self.local_dp is None or not self.target_epsilons):
            raise ValueError("custext and santext need local_dp settings (embeddings) and target epsilons (per token)")
        return self

    def train_configs(self) -> list[tuple[TrainConfig, float | None]]:
        """Every configuration with the target epsilon it was calibrated to (None: noise multiplier given)."""
        out: list[tuple[TrainConfig, float | None]] = []
        for seed in self.seeds:
            for mechanism in self.mechanisms:
                # Categories change neither noiseless nor a sanitization that rewrites every token.
                category_free = mechanism == "noiseless" or (
                    mechanism in LOCAL_DP and self.local_dp is not None and self.local_dp.keep != "non-entities")
                category_sets = self.category_sets[:1] if category_free else self.category_sets
                private = mechanism not in ("noiseless", "deid")
                targets: list[float | None] = list(self.target_epsilons) if private and self.target_epsilons else [None]
                for categories in category_sets:
                    for target in targets:
                        out.append((self._config(mechanism, categories, target, seed), target))
        return out

    def _config(self, mechanism: str, categories: list[str], target: float | None, seed: int) -> TrainConfig:
        return TrainConfig(
            dataset=self.dataset, mechanism=mechanism, categories=categories, model=self.model,  # type: ignore[arg-type]
            model_size=self.model_size, steps=self.rounds if mechanism in FEDERATED else self.steps,
            public_steps=self.public_steps, batch_size=self.batch_size, lr=self.lr, q_user=self.q_user,
            q_entity=self.q_entity, q_extended=self.q_extended,
            noise_multiplier=None if target is not None else self.noise_multiplier, target_epsilon=target,
            clip=self.clip, local_steps=self.local_steps, local_lr=self.local_lr, delta=self.delta,
            max_len=self.max_len, checkpoint_every=self.checkpoint_every, seed=seed, device=self.device,
            processes=self.processes, local_dp=self.local_dp if mechanism in LOCAL_DP else None,
            randomness=self.randomness, public_count=self.public_count)


@dataclass(frozen=True)
class SweepOutcome:
    parent_run_id: str
    runs: list[TrainResult]
    failed: list[str]  # run names of configurations that failed
    report: list[str]  # files of the privacy-utility report


@flow(name="uedp-sweep", flow_run_name="sweep-{config.dataset}")
def sweep_flow(config: SweepConfig) -> SweepOutcome:
    home = DataHome(Path(config.home))
    logger = get_run_logger()
    configs = config.train_configs()
    flow_run_id = str(runtime.flow_run.id or "")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    parent = RunTracker(home, config.dataset, f"sweep-{stamp}",
                        {"uedp.dataset": config.dataset, "uedp.kind": "sweep", "uedp.flow_run_id": flow_run_id})
    parent.log_params({"mechanisms": config.mechanisms, "category_sets": [" ".join(c) for c in config.category_sets],
                       "target_epsilons": config.target_epsilons or "none", "seeds": config.seeds,
                       "model": config.model, "model_size": config.model_size, "configurations": len(configs),
                       "randomness": config.randomness,
                       "noise_multiplier": config.noise_multiplier if not config.target_epsilons else "calibrated"})
    logger.info("sweep: %d configurations, parent MLflow run %s", len(configs), parent.run_id)
    outcomes: list[tuple[TrainResult, float | None]] = []
    failed: list[str] = []
    try:
        # One at a time: trainings on one machine would compete for its one GPU (deployments add a
        # concurrency limit on the "uedp-train" tag for work pools with several workers).
        for train_config, target in configs:
            state = train_task.with_options(tags=["uedp-train"])(home, train_config, flow_run_id, parent.run_id,
                                                                 config.store, return_state=True)
            if state.is_completed():
                outcomes.append((state.result(), target))
            else:
                failed.append(train_config.run_name())
                logger.error("%s failed: %s", train_config.run_name(), state.message)
        title = f"uedp sweep on {config.dataset} ({config.model} {config.model_size})"
        files = report_task(home, config.dataset, outcomes, parent.run_id, title) if outcomes else []
        parent.log_metrics({"configurations_failed": len(failed), "configurations_finished": len(outcomes)})
    except BaseException:
        parent.finish(failed=True)
        raise
    parent.finish(failed=bool(failed))
    if failed:
        raise UedpError(f"{len(failed)} of {len(configs)} configurations failed: {', '.join(failed)} "
                        f"(the others are in MLflow run {parent.run_id}; rerun to resume from checkpoints)")
    return SweepOutcome(parent.run_id, [r for r, _ in outcomes], failed, [str(f) for f in files])
