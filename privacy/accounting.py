"""Privacy accounting behind one small interface, computed by ``dp_accounting`` (never by hand).

A mechanism describes one training round as a ``DpEvent``; :class:`RoundAccountant` composes one per
round and reports ``(epsilon, delta)`` after each. ``pld`` (privacy loss distributions) gives the
tightest figure and is the default for reported numbers; ``rdp`` (Renyi DP) is faster and looser.
Both are upper bounds, so both are sound to report; the run says which one it used.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Callable, Literal

import dp_accounting
from dp_accounting import pld, rdp

AccountantKind = Literal["pld", "rdp"]
ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")
MIN_NOISE_MULTIPLIER = 0.3

# dp_accounting's RDP code logs a warning for every fractional order it cannot evaluate; those orders
# are excluded from the minimum, which keeps the bound valid. Keep them out of users' terminals.
logging.getLogger("absl").setLevel(logging.ERROR)


def make_accountant(kind: AccountantKind) -> dp_accounting.PrivacyAccountant:
    if kind == "pld":
        return pld.PLDAccountant()
    if kind == "rdp":
        return rdp.RdpAccountant()
    raise ValueError(f"unknown accountant {kind!r}; valid: {', '.join(ACCOUNTANTS)}")


def poisson_gaussian_round(sampling_probability: float, noise_multiplier: float) -> dp_accounting.DpEvent:
    """One round of the sampled Gaussian mechanism: each unit sampled w.p. q, noise z * sensitivity."""
    return dp_accounting.PoissonSampledDpEvent(sampling_probability, dp_accounting.GaussianDpEvent(noise_multiplier))


def epsilon_after(round_event: dp_accounting.DpEvent, rounds: int, delta: float, kind: AccountantKind = "pld") -> float:
    """Epsilon after ``rounds`` self-composed rounds at ``delta``."""
    if rounds <= 0:
        return 0.0
    accountant = make_accountant(kind)
    accountant.compose(round_event, rounds)
    return float(accountant.get_epsilon(delta))


def calibrate_noise_multiplier(
    round_event_for: Callable[[float], dp_accounting.DpEvent],
    rounds: int,
    target_epsilon: float,
    delta: float,
    kind: AccountantKind = "pld",
) -> float:
    """Smallest noise multiplier z (bisection, by dp_accounting) whose epsilon after ``rounds`` is <= target.

    The result is within 0.1% of the boundary in z, so its epsilon lies just below the target.
    """
    if target_epsilon <= 0 or not math.isfinite(target_epsilon):
        raise ValueError(f"target epsilon must be a positive number, got {target_epsilon}")
    def event(noise: float) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(round_event_for(noise), rounds)

    # Below z = MIN_NOISE_MULTIPLIER the PLD discretisation needs tens of GiB and epsilon is in the
    # hundreds anyway: a target that such little noise already meets is reported, not searched.
    floor_epsilon = epsilon_after(round_event_for(MIN_NOISE_MULTIPLIER), rounds, delta, kind)
    if floor_epsilon <= target_epsilon:
        raise ValueError(
            f"target epsilon {target_epsilon:g} is met even with noise multiplier {MIN_NOISE_MULTIPLIER} "
            f"(epsilon {floor_epsilon:.3g}); give a noise multiplier instead"
        )
    z = dp_accounting.calibrate_dp_mechanism(
        lambda: make_accountant(kind),
        event,
        target_epsilon,
        delta,
        bracket_interval=dp_accounting.LowerEndpointAndGuess(MIN_NOISE_MULTIPLIER, 1.0),
        tol=1e-3,
    )
    return float(z)


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


class RoundAccountant:
    """Composes one identical ``DpEvent`` per round; ``epsilon`` is valid for the rounds run so far.

    ``peek`` answers what epsilon would be after one more round, so training can stop *before* a
    round that would exceed a budget (nothing is released for a round that does not run).
    """

    def __init__(self, round_event: dp_accounting.DpEvent, delta: float, kind: AccountantKind = "pld"):
        self.round_event = round_event
        self.delta = delta
        self.kind: AccountantKind = kind
        self.rounds = 0
        self.epsilon = 0.0

    def peek(self, extra_rounds: int = 1) -> float:
        return epsilon_after(self.round_event, self.rounds + extra_rounds, self.delta, self.kind)

    def step(self) -> float:
        self.epsilon = self.peek(1)
        self.rounds += 1
        return self.epsilon

    def state_dict(self) -> dict[str, object]:
        """What a checkpoint must keep so a resumed run never spends privacy twice."""
        return {"rounds": self.rounds, "epsilon": self.epsilon, "delta": self.delta, "kind": self.kind}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.rounds = int(state["rounds"])  # type: ignore[arg-type]
        self.epsilon = float(state["epsilon"])  # type: ignore[arg-type]
