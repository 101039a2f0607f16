"""The configuration of one local-DP sanitization of a dataset's train split (``uedp sanitize``, and what a
custext/santext training draws), beside the services that draw and open releases."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from uedp.detection.categories import Categories
from uedp.privacy.mechanisms.params import SanitizationSettings
from uedp.privacy.sanitization.choices import LOCAL_DP_FACTS
from uedp.privacy.statement import RandomnessMode
from uedp.services.config import LocalDpName
from uedp.storage.home import validate_dataset_name


class SanitizeConfig(SanitizationSettings):
    """One local-DP sanitization of a dataset's train split (the settings a custext/santext training uses)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = Field(description="the dataset whose train split is sanitized")
    mechanism: LocalDpName = Field("custext", description="custext (CusText: a fixed output set per token) or "
                                   "santext (SanText: any token, weighted by distance)")
    epsilon: float = Field(gt=0, description="per-token epsilon of the exponential mechanism")
    embeddings: str = Field(description="a vector file (GloVe/word2vec text, .npz) or model:<pretrained folder>")
    categories: Categories = Field(default_factory=lambda: ["PII"], validate_default=True,
                                   description="with keep=non-entities: the categories whose entities are sanitized "
                                               "(default: every personal-information category)")
    seed: int = Field(0, description="seed of the draws with randomness=seeded (and of the attack's sample)")
    randomness: RandomnessMode = Field(
        "secure", description="secure: OS randomness, never stored (a real release); seeded: from the seed, "
                              "reproducible, no guarantee against anyone who knows it")
    output: str | None = Field(None, description="name of the sanitized dataset (default: derived)")
    attack_sentences: int = Field(200, ge=1, description="train sentences the attack samples")

    @model_validator(mode="after")
    def _valid_name(self) -> SanitizeConfig:
        validate_dataset_name(self.output_name)
        return self

    @property
    def output_name(self) -> str:
        """The release's name: everything a sweep varies that changes the draw (one name, one release;
        a second release under a name that holds one is refused, never drawn over it)."""
        if self.output:
            return self.output
        plus = {"none": "", "stopwords": "-plus", "non-entities": "-entities"}[self.keep]
        k = f"-k{self.k}" if LOCAL_DP_FACTS[self.mechanism].has_output_sets else ""
        seeded = f"-seeded{self.seed}" if self.randomness == "seeded" else ""  # secure: the seed draws nothing
        name = f"{self.dataset}-{self.mechanism}-e{self.epsilon:g}{k}-{self.strategy}{plus}{seeded}"
        if self.keep != "non-entities":
            return name
        which = "-".join(sorted(self.categories))
        if len(name) + 1 + len(which) > 64:  # dataset names are folder names: 64 characters at most
            which = "c" + hashlib.sha256(which.encode()).hexdigest()[:8]
        return f"{name}-{which}"

    def release_settings(self) -> dict[str, Any]:
        """The settings that decide the draw (the release's identity with the source text, the entities
        and the vectors): not the output name or the attack, nor the seed of a secure draw, which only
        picks the attack's sample."""
        settings = self.model_dump(exclude={"output", "embeddings", "attack_model", "attack_sentences"})
        if self.randomness == "secure":
            settings["seed"] = 0  # as releases were keyed before the seed was left out: they stay current
        return settings
