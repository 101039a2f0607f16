"""Noise for a target: the smallest noise multiplier whose run ends within a target epsilon (bisection
over dp_accounting's exact figures), and the check that delta is small beside the number of units."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import dp_accounting

from uedp.privacy.accounting.events import (
    MIN_NOISE_MULTIPLIER,
    AccountantKind,
    Adjacency,
    epsilon_after,
    make_accountant,
    with_initial,
)


def calibrate_noise_multiplier(
    round_event_for: Callable[[float], dp_accounting.DpEvent],
    rounds: int,
    target_epsilon: float,
    delta: float,
    kind: AccountantKind = "pld",
    adjacency: Adjacency = "add_remove",
    initial: dp_accounting.DpEvent | None = None,
    floor: float = MIN_NOISE_MULTIPLIER,
) -> float:
    """Smallest noise multiplier z (bisection, by dp_accounting) whose epsilon after ``rounds`` (and the
    one-time ``initial`` release, whose noise z does not change) is <= target.

    ``floor`` is the least z searched: ``MIN_NOISE_MULTIPLIER`` for one Gaussian per round, scaled up
    where the round's event divides z (uedp-bounded's group event: ``MIN_NOISE_MULTIPLIER * sqrt(g)``).
    The result is within 0.1% of the boundary in z, so its epsilon lies just below the target.
    """
    if target_epsilon <= 0 or not math.isfinite(target_epsilon):
        raise ValueError(f"target epsilon must be a positive number, got {target_epsilon}")
    if initial is not None and epsilon_after(round_event_for(1.0), 0, delta, kind, adjacency, initial) >= target_epsilon:
        raise ValueError(f"target epsilon {target_epsilon:g} is spent by the DP count of units alone; "
                         "give the count more noise or declare the count public")

    def event(noise: float) -> dp_accounting.DpEvent:
        return with_initial(dp_accounting.SelfComposedDpEvent(round_event_for(noise), rounds), initial)

    # Below z = MIN_NOISE_MULTIPLIER the PLD discretisation needs tens of GiB and epsilon is in the
    # hundreds anyway: a target that such little noise already meets is reported, not searched.
    floor_epsilon = epsilon_after(round_event_for(floor), rounds, delta, kind, adjacency, initial)
    if floor_epsilon <= target_epsilon:
        raise ValueError(
            f"target epsilon {target_epsilon:g} is met even with noise multiplier {floor:.3g} "
            f"(epsilon {floor_epsilon:.3g}); give a noise multiplier instead"
        )
    z = dp_accounting.calibrate_dp_mechanism(
        lambda: make_accountant(kind, adjacency),
        event,
        target_epsilon,
        delta,
        bracket_interval=dp_accounting.LowerEndpointAndGuess(floor, max(1.0, 2 * floor)),
        tol=1e-3,
    )
    return float(z)


def resolve_noise_multiplier(mechanism: str, noise_multiplier: float | None, target_epsilon: float | None,
                             round_event_for: Callable[[float], dp_accounting.DpEvent], rounds: int, delta: float,
                             kind: AccountantKind, adjacency: Adjacency = "add_remove",
                             initial: dp_accounting.DpEvent | None = None, floor: float = MIN_NOISE_MULTIPLIER) -> float:
    """The z a run uses: calibrated to ``target_epsilon`` when given, else the given positive one."""
    if target_epsilon is not None:
        return calibrate_noise_multiplier(round_event_for, rounds, target_epsilon, delta, kind, adjacency, initial,
                                          floor)
    if noise_multiplier is None or noise_multiplier <= 0:
        raise ValueError(f"{mechanism} needs a positive noise multiplier or a target epsilon")
    return noise_multiplier


def check_delta(delta: float, privacy_units: int) -> str | None:
    """PRIVACY.md: delta must stay below 1 / (number of privacy units). Returns a warning text or None."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if privacy_units > 0 and delta >= 1.0 / privacy_units:
        message = (
            f"delta={delta:g} is not below 1/{privacy_units} (the number of privacy units); "
            "such a guarantee allows releasing one unit's data outright"
        )
        warnings.warn(message, stacklevel=2)
        return message
    return None
