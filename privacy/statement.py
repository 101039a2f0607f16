"""What a reported epsilon means, as one record: the statement every mechanism, a local-DP release and a
training on one end with, logged as run parameters next to the figures. It sits on the privacy core's
floor, below the mechanisms, so the count of units and the local-DP releases state guarantees without
importing the mechanisms' machinery."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

# Where a run's data-touching randomness comes from (privacy.randomness draws it; configurations name it).
RandomnessMode = Literal["secure", "seeded"]

__all__ = ["PrivacyStatement", "PrivacyUnit", "RandomnessMode"]


@dataclass(frozen=True)
class PrivacyUnit:
    """A privacy unit as releases compose: what neighbouring datasets differ in (``adjacency``: add/remove,
    replace-one, substitution, local), in what (``kind``: a sequence, a user, a user and an entity, a value
    inside a detected span, a sanitized token), and a readable ``name`` for people. Each mechanism's registry
    entry states its unit so (``MechanismSpec.privacy_unit``); the privacy ledger composes releases by
    :attr:`key`, never by a statement's wording: two wordings of one unit are one total.

    A tokenizer is not part of the key: where the unit is a token's value (selective), a change to one byte
    of a detected span changes the value of the token holding it, whichever tokenizer cut it, so every such
    release bounds the byte's exposure and one total composes them all (erring towards counting too much)."""

    adjacency: str
    kind: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.adjacency}:{self.kind}"


@dataclass(frozen=True)
class PrivacyStatement:
    """What the reported epsilon means: logged as run parameters next to the figures."""

    mechanism: str
    unit: str
    epsilon: float = math.inf
    delta: float = 0.0
    accountant: str = "none"
    noise_multiplier: float = 0.0
    sampling_probability: float = 1.0
    rounds: int = 0
    notes: str = ""
    extra: dict[str, float] = field(default_factory=dict)
    # "secure" (OS randomness, never stored), "seeded" (the guarantee does not hold against anyone who
    # knows the seed: RandomnessMode) or "none" (no guarantee to keep).
    randomness: str = "none"
    public: tuple[str, ...] = ()  # what the guarantee treats as public (PRIVACY.md rule 4)
    caveats: tuple[str, ...] = ()  # what the epsilon does not cover
