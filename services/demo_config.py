"""The configuration of ``uedp demo`` (the Prefect form of the demo flow)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from uedp.detection.categories import Categories, default_categories
from uedp.models.presets import Device
from uedp.services.config import HOME_HELP, RANDOMNESS_HELP, MechanismName, MechanismSettings, TrainConfig, nest_flat


class DemoConfig(BaseModel):
    """Parameters of the demo flow; the Prefect UI renders these as a form. Mechanism parameters may be
    given flat (``DemoConfig(home=..., q_user=0.2)``)."""

    model_config = ConfigDict(extra="forbid")

    home: str = Field("", description=HOME_HELP)
    dataset: str = Field("demo", description="the name the bundled demo corpus is ingested under")
    mechanisms: list[MechanismName] = Field(default_factory=lambda: ["noiseless", "deid", "userdp", "uedp"],
                                            description="the mechanisms to train, one run each")
    categories: Categories = Field(default_factory=default_categories, validate_default=True,
                                   description="the entity categories treated as sensitive (canonical names or "
                                   "composites such as PII)")
    seed: int = Field(0, description="initial weights and the by-user split (and every draw with seeded "
                      "randomness)")
    # Seeded, so the demo's table is reproducible; its runs are tagged and their statements say the
    # guarantee does not hold against anyone who knows the seed.
    randomness: Literal["secure", "seeded"] = Field("seeded", description=RANDOMNESS_HELP)
    device: Device | str = Field("auto", description="auto (a GPU when there is one), cpu, cuda or cuda:N")
    settings: MechanismSettings = Field(default_factory=MechanismSettings,
                                        description="mechanism parameters (each mechanism takes the ones it knows)")

    @model_validator(mode="before")
    @classmethod
    def _flat_form(cls, data: Any) -> Any:
        return nest_flat(data, set(cls.model_fields), "settings") if isinstance(data, dict) else data

    def train_configs(self) -> list[TrainConfig]:
        settings = self.settings.model_dump()
        return [TrainConfig.for_mechanism(mechanism, **settings, dataset=self.dataset, categories=self.categories,
                                          seed=self.seed, device=self.device, randomness=self.randomness)
                for mechanism in self.mechanisms]
