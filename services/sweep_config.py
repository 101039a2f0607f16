"""The configuration of a sweep (mechanisms x category sets x target epsilons x seeds x a grid), the Prefect
form of ``uedp sweep`` and the results pages, and the configurations it plans."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from uedp.detection.categories import Categories
from uedp.privacy.mechanisms import registry
from uedp.privacy.mechanisms.params import NOISE_OR_TARGET
from uedp.services.config import (
    HOME_HELP,
    MechanismName,
    MechanismSettings,
    RunSettings,
    TrainConfig,
    nest_flat,
    parameter_names,
)


class SweepConfig(BaseModel):
    """Parameters of a sweep; the Prefect UI renders these as a form (the base as nested forms). Like a
    training configuration it can be written flat: ``SweepConfig(..., model="lstm", q_user=0.1)``."""

    model_config = ConfigDict(extra="forbid")

    home: str = Field("", description=HOME_HELP)
    dataset: str = Field(description="an ingested and detected dataset of the data home")
    mechanisms: list[MechanismName] = Field(default_factory=lambda: ["noiseless", "userdp", "uedp"],
                                            min_length=1, description="the mechanisms to train; those that ignore "
                                            "categories (noiseless, dpsgd, userdp) train once per epsilon and seed")
    category_sets: list[Categories] = Field(default_factory=lambda: [["PERSON", "LOC", "ORG"]], min_length=1,
                                            description="each entry is one set of sensitive categories")
    target_epsilons: list[float] = Field(default_factory=list, description="calibrate each private mechanism to "
                                         "each; empty: use the noise multiplier")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="one run per seed (initial "
                             "weights; every draw too with seeded randomness); the report shows their spread")
    run: RunSettings = Field(default_factory=RunSettings, description="settings every configuration shares")
    settings: MechanismSettings = Field(default_factory=MechanismSettings,
                                        description="mechanism parameters (each mechanism takes the ones it knows)")
    store: str | None = Field(None, description="fsspec URL of the shared table store (s3://bucket/uedp); "
                                                "empty: the data home only")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="more axes: a mechanism parameter and its "
                                       "values; each mechanism that takes the parameter runs once per value "
                                       "(e.g. holders_per_entity: [1, 4, 16])")
    reuse_finished: bool = Field(False, description="a configuration already trained to the end on the same "
                                 "data, detections and start is not trained again: its finished MLflow run is "
                                 "reported (a sweep or page stopped halfway continues where it stopped)")

    @field_validator("grid")
    @classmethod
    def _grid_of_parameters(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        known = set(MechanismSettings.model_fields) - {"target_epsilon", "noise_multiplier", "epsilon"}
        for name, values in grid.items():
            if name not in known:
                raise ValueError(f"grid axis {name!r} is not a mechanism parameter (epsilons: target_epsilons); "
                                 f"valid: {', '.join(sorted(known))}")
            if not values:
                raise ValueError(f"grid axis {name!r} has no values")
        return grid

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
        if self.target_epsilons and self.settings.noise_multiplier is not None:  # type: ignore[attr-defined]
            raise ValueError(f"{NOISE_OR_TARGET} (target_epsilons calibrate z for each configuration)")
        self.items()  # every configuration validates before any work starts
        return self

    def items(self) -> list[SweepItem]:
        """Every configuration with the target epsilon it was calibrated to (None: noise multiplier given)."""
        base = {**self.settings.model_dump(), **self.run.model_dump()}
        items: list[SweepItem] = []
        for seed in self.seeds:
            for mechanism in self.mechanisms:
                spec = registry.get(mechanism)
                targets: list[float | None] = list(self.target_epsilons) if spec.private and self.target_epsilons else [None]
                # A grid axis applies to the field that takes that name (rounds also answers to steps).
                names = parameter_names(spec.params)
                fields: dict[str, str] = {}
                for axis in self.grid:
                    field = next((f for f, alias in names.items() if axis in alias), None)
                    if field is not None:
                        fields[axis] = field
                axes = {axis: values for axis, values in self.grid.items() if axis in fields}
                for target, point in itertools.product(targets, _points(axes)):
                    # A grid epsilon replaces any budget in the base (custext/santext: the per-token epsilon).
                    budget = {"target_epsilon": target, "epsilon": target} if target is not None else {}
                    values = {**base, **{fields[axis]: value for axis, value in point.items()}, **budget}
                    variant = "-".join(f"{axis}={value}" for axis, value in point.items()
                                       if fields[axis] not in spec.params.label_fields)
                    configs = [TrainConfig.for_mechanism(mechanism, **values, dataset=self.dataset,
                                                         categories=categories, seed=seed, variant=variant)
                               for categories in self.category_sets]
                    if not spec.uses_categories(configs[0].params):
                        configs = configs[:1]  # categories change nothing: train once
                    # The epsilon each run is set to reach: the grid's, or a budget given in the base.
                    items.extend(SweepItem(config, config.params.budget if spec.private else None)
                                 for config in configs)
        return items


def _points(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid axes a mechanism takes ([{}] when it takes none)."""
    return [dict(zip(axes, combination)) for combination in itertools.product(*axes.values())]


@dataclass(frozen=True)
class SweepItem:
    config: TrainConfig
    target: float | None  # the target epsilon it was calibrated to; None: noise multiplier given
