"""Noise for a target: the smallest noise multiplier whose run ends within a target epsilon (on a grid, by
dp_accounting's exact figures after a fast coarse search), and the check that delta is small beside the
number of units."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import dp_accounting

from uedp.privacy.accounting.events import (
    MIN_NOISE_MULTIPLIER,
    SEARCH_DISCRETIZATION,
    AccountantKind,
    Adjacency,
    epsilon_after,
)
from uedp.privacy.accounting.memo import remembered

# z is calibrated on a grid of this step: the smallest multiple of it whose epsilon is within the target. A
# grid (not a bisection's last bracket) makes the answer the same whichever way the search reached it.
GRID_STEPS_PER_UNIT = 10000
TOLERANCE = 1 / GRID_STEPS_PER_UNIT
# The most the exact figure's correction moves the coarse estimate, in log z (5%): the coarse grid's bias
# moves the crossing by a few grid steps, never more.
MAX_CORRECTION = math.log(1.05)


class MetAtFloor(ValueError):
    """The target is met even at the least noise a calibration searches."""


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
    """Smallest noise multiplier z on a grid of step :data:`TOLERANCE` whose epsilon after ``rounds`` (and
    the one-time ``initial`` release, whose noise z does not change) is <= target, by dp_accounting's
    accountant of ``kind``.

    ``floor`` is the least z searched: ``MIN_NOISE_MULTIPLIER`` for one Gaussian per round, scaled up
    where the round's event divides z (uedp-bounded's group event: ``MIN_NOISE_MULTIPLIER * sqrt(g)``).
    Raises :class:`MetAtFloor` when the target is met there.

    Fast, with the same answer: a search on a coarser PLD grid (:data:`SEARCH_DISCRETIZATION`, regula falsi
    on log epsilon against log z) says where z lies, and the run's own accountant then decides the grid
    point: the first z whose epsilon is within the target, with the one a step below it beyond (one figure
    at the coarse estimate corrects its bias; then two or three; more only if the coarse search was off). Remembered by its arguments
    (:mod:`privacy.accounting.memo`): ``round_event_for`` is identified by its events at z = 1 and z = 2,
    which determine it for every event uedp builds (each Gaussian's noise multiplier is z times a constant).
    """
    if target_epsilon <= 0 or not math.isfinite(target_epsilon):
        raise ValueError(f"target epsilon must be a positive number, got {target_epsilon}")
    if initial is not None and epsilon_after(round_event_for(1.0), 0, delta, kind, adjacency, initial) >= target_epsilon:
        raise ValueError(f"target epsilon {target_epsilon:g} is spent by the DP count of units alone; "
                         "give the count more noise or declare the count public")
    arguments = (repr(round_event_for(1.0)), repr(round_event_for(2.0)), rounds, target_epsilon, delta, kind,
                 adjacency, repr(initial), floor, GRID_STEPS_PER_UNIT)
    return float(remembered("calibration", arguments, lambda: _calibrate(
        round_event_for, rounds, target_epsilon, delta, kind, adjacency, initial, floor)))


def _calibrate(round_event_for: Callable[[float], dp_accounting.DpEvent], rounds: int, target: float, delta: float,
               kind: AccountantKind, adjacency: Adjacency, initial: dp_accounting.DpEvent | None, floor: float) -> float:
    def exact(z: float) -> float:
        return epsilon_after(round_event_for(z), rounds, delta, kind, adjacency, initial)

    def coarse(z: float) -> float:
        return epsilon_after(round_event_for(z), rounds, delta, kind, adjacency, initial,
                             SEARCH_DISCRETIZATION if kind == "pld" else None)

    estimate = _estimate(coarse, target, floor)
    lowest = math.ceil(floor * GRID_STEPS_PER_UNIT - 1e-9)
    within: dict[int, bool] = {}

    def meets(step: int) -> bool:
        if step not in within:
            within[step] = exact(step / GRID_STEPS_PER_UNIT) <= target
        return within[step]

    def grid_step(z: float) -> int:
        return max(lowest, math.ceil(z * GRID_STEPS_PER_UNIT - 1e-9))

    start = lowest
    if estimate is not None:
        z_coarse, slope = estimate
        start = grid_step(z_coarse)
        # The coarse grid's figure is off the exact one by a bias that moves its crossing a few grid steps:
        # one exact figure there and the coarse slope (log epsilon against log z) say where the exact
        # crossing lies, so the bracket below usually needs one more figure. Only where the search starts
        # changes: the grid point is still decided by exact figures on both sides of it.
        at_start = exact(start / GRID_STEPS_PER_UNIT)
        within[start] = at_start <= target
        if slope < 0 and 0 < at_start < math.inf:
            step = -math.log(at_start / target) / slope
            # A slope from two nearby coarse figures can be mostly rounding: a step beyond a few percent of z
            # is not a correction of the grid's bias, and the bracket starts where the coarse search ended.
            if abs(step) <= MAX_CORRECTION:
                start = grid_step(math.exp(math.log(start / GRID_STEPS_PER_UNIT) + step))

    # Below z = MIN_NOISE_MULTIPLIER the PLD discretisation needs tens of GiB and epsilon is in the
    # hundreds anyway: a target that such little noise already meets is reported, not searched.
    low, high = _bracket(meets, start, lowest)
    if high == lowest and (lowest / GRID_STEPS_PER_UNIT == floor or exact(floor) <= target):
        raise MetAtFloor(f"target epsilon {target:g} is met even with noise multiplier {floor:.3g} "
                         f"(epsilon {exact(floor):.3g}); give a noise multiplier instead")
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if meets(middle) else (middle, high)
    return high / GRID_STEPS_PER_UNIT


def _bracket(meets: Callable[[int], bool], start: int, lowest: int) -> tuple[int, int]:
    """Grid steps (low, high) with ``meets(high)`` and not ``meets(low)`` and, where they are neighbours,
    high the answer; high == lowest when the floor itself meets the target. Steps out from ``start`` by
    doubling gaps."""
    gap = 1
    if meets(start):
        high = start
        while high > lowest:
            low = max(lowest, high - gap)
            if not meets(low):
                return low, high
            high, gap = low, gap * 2
        return lowest - 1, lowest
    low = start
    while True:
        high = low + gap
        if meets(high):
            return low, high
        low, gap = high, gap * 2


def _estimate(epsilon: Callable[[float], float], target: float, floor: float) -> tuple[float, float] | None:
    """Where the coarse epsilon crosses the target, and the slope of log epsilon against log z there: regula
    falsi (Illinois) in a bracket found by doubling from z = 1. None when even the floor meets the target."""
    figured: list[tuple[float, float]] = []  # (log z, gap) as computed, for the slope at the end

    def gap(z: float) -> float:  # an epsilon of 0 (a release too rare to cost anything) is far below any target
        figured.append((math.log(z), math.log(max(epsilon(z), 1e-300) / target)))
        return figured[-1][1]

    z_high = max(1.0, 2 * floor)
    g_high = gap(z_high)
    z_low, g_low = z_high, g_high
    while g_high > 0:  # too little noise: double it
        z_low, g_low = z_high, g_high
        z_high *= 2
        g_high = gap(z_high)
    while g_low <= 0:  # enough noise already: halve it, down to the floor
        if z_low <= floor:
            return None
        z_high, g_high = z_low, g_low
        z_low = max(floor, z_low / 2)
        g_low = gap(z_low)
    side = 0
    for _ in range(60):
        if z_high - z_low < TOLERANCE / 4 or g_high == 0:
            break
        x_low, x_high = math.log(z_low), math.log(z_high)
        x = x_high - g_high * (x_high - x_low) / (g_high - g_low)
        z = min(max(math.exp(x), z_low + (z_high - z_low) * 1e-3), z_high - (z_high - z_low) * 1e-3)
        g = gap(z)
        if g > 0:
            z_low, g_low = z, g
            if side == -1:
                g_high /= 2
            side = -1
        else:
            z_high, g_high = z, g
            if side == 1:
                g_low /= 2
            side = 1
    (x_1, g_1), (x_2, g_2) = figured[-2:] if len(figured) > 1 else (figured[-1], figured[-1])
    return z_high, (g_2 - g_1) / (x_2 - x_1) if x_2 != x_1 else 0.0


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
