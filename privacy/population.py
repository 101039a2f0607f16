"""How many privacy units a run may assume it has, without releasing the exact count (PRIVACY.md, rule 4).

Every central mechanism needs a count of its units: userdp and uedp divide the noised sum by the
expected number of sampled users ``q_user * N``, DP-SGD samples with ``q = B / N``, and uedp's bound M
on sampled users needs an upper bound on N. Under add/remove adjacency N itself is private (one
added user moves it by one), and a denominator or rate computed from it is released with the model:
the update's scale would tell D from D'. So the count comes from one of three places, and the
privacy statement names which:

* ``public-by-adjacency``: under replace-one adjacency (selective) neighbours have the same number of
  units, so the exact count reveals nothing about the protected value;
* ``declared``: the user declares a count public (e.g. a corpus whose size is published); the
  statement lists it as public, and nothing about it is protected;
* ``dp-count`` (the default): ``N + N(0, s^2)`` with the run's secret randomness, released once and
  composed into the reported epsilon as a Gaussian mechanism of sensitivity 1 (one unit added or
  removed moves the count by one). An upper bound ``N_hat + s * Phi^-1(1 - delta_bound)`` holds except
  with probability ``delta_bound``, which the mechanism that needs it charges to delta.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # dp_accounting, scipy and torch load where a count is released or bounded, not to name one
    import dp_accounting

    from uedp.privacy.mechanisms.base import TrainData
    from uedp.privacy.randomness import Randomness

PopulationSource = Literal["public-by-adjacency", "declared", "dp-count"]
# What a mechanism's DP count of units counts (PRIVACY.md rule 4), chosen so one unit moves it by one:
# training sequences, users with training text, or the writers with a sentence that names no detected
# entity (uedp: an entity's sentences cannot add or remove such a writer).
CountedUnits = Literal["sequences", "users", "anchored writers"]
# Each counted kind of unit, in words (what `uedp epsilon` says its DP count counts).
COUNTED_IN_WORDS: dict[str, str] = {"sequences": "sequences", "users": "users",
                                    "anchored writers": "writers with a sentence that names no detected entity"}
DEFAULT_COUNT_NOISE_STD = 10.0


@dataclass(frozen=True)
class Population:
    """The count of privacy units a run uses, with where it came from."""

    value: float  # what denominators and sampling rates use (>= 1)
    source: PopulationSource
    noise_std: float = 0.0  # dp-count: standard deviation of the Gaussian added to the exact count

    @classmethod
    def public_by_adjacency(cls, count: int) -> Population:
        return cls(float(count), "public-by-adjacency")

    @classmethod
    def declared(cls, count: int) -> Population:
        if count < 1:
            raise ValueError(f"a declared public count must be at least 1, got {count}")
        return cls(float(count), "declared")

    @classmethod
    def dp_count(cls, count: int, noise_std: float, randomness: Randomness) -> Population:
        """``count + N(0, noise_std^2)`` drawn from the run's randomness (floored at 1 for use as a divisor)."""
        if not noise_std > 0:
            raise ValueError(f"the count's noise standard deviation must be positive, got {noise_std}")
        noise = float(randomness.stream("population-count").standard_normal())
        return cls(max(1.0, count + noise * noise_std), "dp-count", noise_std)

    def event(self) -> dp_accounting.DpEvent | None:
        """The release to compose into epsilon: a Gaussian of sensitivity 1 for a DP count, else none."""
        import dp_accounting

        return dp_accounting.GaussianDpEvent(self.noise_std) if self.source == "dp-count" else None

    def upper_bound(self, delta_bound: float) -> int:
        """A bound on the true count that fails with probability at most ``delta_bound`` (exact otherwise)."""
        if self.source != "dp-count":
            return int(round(self.value))
        if not 0 < delta_bound < 1:
            raise ValueError(f"the count bound's failure probability must be in (0, 1), got {delta_bound}")
        from scipy.stats import norm

        return int(math.ceil(self.value + self.noise_std * norm.isf(delta_bound)))

    def cross_run_caveat(self, mechanism: str) -> str | None:
        """What a count public by adjacency means for other runs on the same data (PRIVACY.md, "Several
        runs"): released exactly here, it makes another run's DP count of the same units moot. (A declared
        count is already stated as public and unprotected.)"""
        if self.source != "public-by-adjacency":
            return None
        return (f"{mechanism} releases the exact number of its units ({self.value:.0f}, public under its adjacency): "
                "another run on the same data that protects a count of the same units with a DP count (dpsgd's "
                "sequences, userdp's users) hides nothing more once both are shared")

    def describe(self) -> str:
        """One line for the privacy statement."""
        if self.source == "dp-count":
            return (f"number of units: a DP count {self.value:.1f} (Gaussian noise std {self.noise_std:g}, "
                    "composed into epsilon); the exact count is not released")
        if self.source == "declared":
            return f"number of units: {self.value:.0f}, declared public by you (not protected)"
        return f"number of units: {self.value:.0f}, public under replace-one adjacency (neighbours have as many)"


def anchored_users(entities: Mapping[str, Sequence[frozenset[str]]]) -> list[str]:
    """The users uedp trains and counts: those with at least one sentence without a detected entity.

    Under uedp's unit (a user u' and an entity e'), neighbours differ in u' and in every sentence holding
    e'. A sentence without an entity never holds e', so whether a user has one changes only for u':
    the number of such users moves by at most one, as its DP count and the bound M need. Counting every
    user with a sentence would move by one more per writer whose every sentence holds e' (D + u' + ten
    one-sentence writers about e' moved it by 11)."""
    return [user for user, sets in entities.items() if any(not keys for keys in sets)]


def exact_count(counts: CountedUnits, data: TrainData) -> int:
    """The exact number of a mechanism's counted units in its training data (only ever released noised)."""
    if counts == "sequences":
        return len(data.sequences)
    if counts == "anchored writers":
        return len(anchored_users(data.entities or {}))
    return data.n_users
