"""A sweep: one base configuration (shared run settings and every mechanism parameter, each with its
one default) plus a grid (mechanisms x entity category sets x target epsilons x seeds), expanded into
training configurations; and the parent MLflow run that the sweep's runs nest under.

Mechanisms without a guarantee run once per seed and category set they depend on (``noiseless`` once,
since categories do not change it): the registry says which settings a mechanism uses.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from uedp.detection.categories import Categories
from uedp.errors import UedpError
from uedp.privacy.mechanisms import registry
from uedp.storage.home import DataHome
from uedp.tasks.config import MechanismName, MechanismSettings, RunSettings, TrainConfig, nest_flat
from uedp.tasks.tracking import RunTracker
from uedp.tasks.training import TrainResult


class SweepConfig(BaseModel):
    """Parameters of a sweep; the Prefect UI renders these as a form (the base as nested forms). Like a
    training configuration it can be written flat: ``SweepConfig(..., model="lstm", q_user=0.1)``."""

    model_config = ConfigDict(extra="forbid")

    home: str = Field(description="data home (datasets, MLflow store)")
    dataset: str
    mechanisms: list[MechanismName] = Field(default_factory=lambda: ["noiseless", "userdp", "uedp"],
                                            min_length=1)
    category_sets: list[Categories] = Field(default_factory=lambda: [["PERSON", "LOC", "ORG"]], min_length=1,
                                            description="each entry is one set of sensitive categories")
    target_epsilons: list[float] = Field(default_factory=list, description="calibrate each private mechanism to "
                                         "each; empty: use the noise multiplier")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    run: RunSettings = Field(default_factory=RunSettings, description="settings every configuration shares")
    settings: MechanismSettings = Field(default_factory=MechanismSettings,
                                        description="mechanism parameters (each mechanism takes the ones it knows)")
    store: str | None = Field(None, description="fsspec URL of the shared table store (s3://bucket/uedp); "
                                                "empty: the data home only")

    @model_validator(mode="before")
    @classmethod
    def _flat_form(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return nest_flat(data, set(cls.model_fields), "settings", {"run": set(RunSettings.model_fields)})
        return data

    @model_validator(mode="after")
    def _valid(self) -> SweepConfig:
        if any(not (e > 0 and math.isfinite(e)) for e in self.target_epsilons):
            raise ValueError("target epsilons must be positive numbers")
        self.plan()  # every configuration validates before any work starts
        return self

    def plan(self) -> list[SweepItem]:
        """Every configuration with the target epsilon it was calibrated to (None: noise multiplier given)."""
        base = {**self.settings.model_dump(), **self.run.model_dump()}
        items: list[SweepItem] = []
        for seed in self.seeds:
            for mechanism in self.mechanisms:
                spec = registry.get(mechanism)
                targets: list[float | None] = list(self.target_epsilons) if spec.private and self.target_epsilons else [None]
                for target in targets:
                    budget = {"noise_multiplier": None, "target_epsilon": target} if target is not None else {}
                    values = {**base, **budget}
                    configs = [TrainConfig.for_mechanism(mechanism, **values, dataset=self.dataset,
                                                         categories=categories, seed=seed)
                               for categories in self.category_sets]
                    if not spec.uses_categories(configs[0].params):
                        configs = configs[:1]  # categories change nothing: train once
                    items.extend(SweepItem(config, target) for config in configs)
        return items


@dataclass(frozen=True)
class SweepItem:
    config: TrainConfig
    target: float | None  # the target epsilon it was calibrated to; None: noise multiplier given


@dataclass(frozen=True)
class SweepOutcome:
    parent_run_id: str
    runs: list[TrainResult]
    failed: list[str]  # run names of configurations that failed
    report: list[str]  # files of the privacy-utility report


@dataclass
class SweepRun:
    """The sweep's parent MLflow run: opened with the grid as params, finished with the tally."""

    config: SweepConfig
    items: list[SweepItem]
    tracker: RunTracker
    finished: list[tuple[TrainResult, float | None]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, home: DataHome, config: SweepConfig, items: list[SweepItem], flow_run_id: str) -> SweepRun:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        tracker = RunTracker(home, config.dataset, f"sweep-{stamp}",
                             {"uedp.dataset": config.dataset, "uedp.kind": "sweep", "uedp.flow_run_id": flow_run_id})
        tracker.log_params({"mechanisms": config.mechanisms, "category_sets": [" ".join(c) for c in config.category_sets],
                            "target_epsilons": config.target_epsilons or "none", "seeds": config.seeds,
                            "model": config.run.model, "model_size": config.run.model_size,
                            "configurations": len(items), "randomness": config.run.randomness,
                            "noise_multiplier": config.settings.noise_multiplier  # type: ignore[attr-defined]
                            if not config.target_epsilons else "calibrated"})
        return cls(config, items, tracker)

    @property
    def run_id(self) -> str:
        return self.tracker.run_id

    def record(self, item: SweepItem, result: TrainResult | None) -> None:
        if result is None:
            self.failed.append(item.config.run_name())
        else:
            self.finished.append((result, item.target))

    def finish(self, report: list[str]) -> SweepOutcome:
        """Close the parent run; a sweep with failed configurations ends failed, naming them."""
        self.tracker.log_metrics({"configurations_failed": len(self.failed),
                                  "configurations_finished": len(self.finished)})
        self.tracker.finish(failed=bool(self.failed))
        if self.failed:
            raise UedpError(f"{len(self.failed)} of {len(self.items)} configurations failed: {', '.join(self.failed)} "
                            f"(the others are in MLflow run {self.run_id}; rerun to resume from checkpoints)")
        return SweepOutcome(self.run_id, [r for r, _ in self.finished], [], report)

    def abort(self) -> None:
        self.tracker.finish(failed=True)
