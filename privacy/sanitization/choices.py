"""The local-DP sanitizers' names, units and settings, apart from their machinery (torch, numpy): the
configuration models, the mechanism registry and the CLI's flags name them without loading it.
:mod:`.release` builds each sanitizer for a name listed here; :mod:`.mechanisms` and :mod:`.mapping`
implement them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Metric = Literal["euclidean", "cosine"]
MappingMode = Literal["aggressive", "balanced", "conservative"]


@dataclass(frozen=True)
class LocalDpFacts:
    """What a sanitizer's release is, apart from how it draws (:class:`.release.LocalDpKind` adds that)."""

    unit: str  # what its epsilon protects, as the release states it
    has_output_sets: bool = False  # custext: tokens whose input set has no other member have no guarantee
    metric_dp: bool = False  # santext: the asked epsilon is metric DP; the headline is epsilon x diameter


# Every sanitizer, by name, in listing order.
LOCAL_DP_FACTS: dict[str, LocalDpFacts] = {
    "custext": LocalDpFacts("one sanitized token, replaced by another token of its input set (tokens sharing its "
                            "output set)", has_output_sets=True),
    "santext": LocalDpFacts("one sanitized token, replaced by any vocabulary token", metric_dp=True),
}


Strategy = Literal["token"]
WITHDRAWN_STRATEGIES = {
    "record": "repeats of a token in a record share one draw, so 'x y x' and 'x' y x' give outputs whose "
              "probability ratio is unbounded: no per-token epsilon holds",
    "dataset": "repeats of a token anywhere share one draw: no per-token epsilon holds, and one trusted draw for "
               "all users is not local DP",
}


def check_strategy(name: str) -> str:
    """``token`` (one independent draw per occurrence), or an error saying why another was withdrawn."""
    if name == "token":
        return name
    why = WITHDRAWN_STRATEGIES.get(name)
    if why is None:
        raise ValueError(f"unknown sanitization strategy {name!r}; valid: token")
    raise ValueError(f"sanitization strategy {name!r} was withdrawn: {why}; use 'token' (docs/PRIVACY.md)")
