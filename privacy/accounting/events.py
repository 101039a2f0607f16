"""Training rounds as ``dp_accounting`` events, and epsilon after a number of them: the wrappers every
mechanism accounts with (PLD by default, RDP on request; never a hand-written formula)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TypeVar

import dp_accounting
from dp_accounting import pld, rdp

# The names live in .kinds (importable without dp_accounting); the accountants' callers find them here too.
from uedp.privacy.accounting.kinds import ACCOUNTANTS as ACCOUNTANTS
from uedp.privacy.accounting.kinds import AccountantKind as AccountantKind
from uedp.privacy.accounting.kinds import Adjacency as Adjacency
from uedp.privacy.accounting.memo import remembered

T = TypeVar("T")


MIN_NOISE_MULTIPLIER = 0.3


# dp_accounting's RDP code logs a warning for every fractional order it cannot evaluate; those orders
# are excluded from the minimum, which keeps the bound valid. Keep them out of users' terminals.
logging.getLogger("absl").setLevel(logging.ERROR)


PLD_OUT_OF_MEMORY = ("the PLD accountant ran out of memory discretising this little noise ({detail}); "
                     f"below a noise multiplier of about {MIN_NOISE_MULTIPLIER:g} epsilon is in the hundreds anyway: "
                     "give more noise (or a target epsilon), or use the rdp accountant")


def fits_in_memory(compute: Callable[[], T]) -> T:
    """Run a PLD computation, turning numpy's out-of-memory error (the discretisation of a privacy loss
    distribution grows as the noise shrinks: 38 GiB at z = 0.001) into a ValueError that says what to do."""
    try:
        return compute()
    except MemoryError as exc:
        raise ValueError(PLD_OUT_OF_MEMORY.format(detail=str(exc).split(" for an array")[0] or "MemoryError")) from None


# A coarser PLD grid, for searches only: about six times faster per figure, and within about 1e-4 of the
# exact figure at the settings uedp plans (every figure a run reports uses dp_accounting's default grid).
SEARCH_DISCRETIZATION = 1e-3


def make_accountant(kind: AccountantKind, adjacency: Adjacency = "add_remove",
                    discretization: float | None = None) -> dp_accounting.PrivacyAccountant:
    """dp_accounting's accountant of ``kind`` for ``adjacency``; ``discretization``: a PLD grid other than
    dp_accounting's default (searches only: :data:`SEARCH_DISCRETIZATION`)."""
    relation = neighboring_relation(adjacency)
    if kind == "pld":
        if discretization is not None:
            return pld.PLDAccountant(relation, value_discretization_interval=discretization)
        return pld.PLDAccountant(relation)
    if kind == "rdp":
        if adjacency == "replace":
            raise ValueError("the rdp accountant cannot account replace-one adjacency under Poisson sampling; use pld")
        return rdp.RdpAccountant()
    raise ValueError(f"unknown accountant {kind!r}; valid: {', '.join(ACCOUNTANTS)}")


def neighboring_relation(adjacency: Adjacency) -> dp_accounting.NeighboringRelation:
    if adjacency == "add_remove":
        return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    if adjacency == "replace":
        return dp_accounting.NeighboringRelation.REPLACE_ONE
    raise ValueError(f"unknown adjacency {adjacency!r}; valid: add_remove, replace")


def poisson_gaussian_round(sampling_probability: float, noise_multiplier: float) -> dp_accounting.DpEvent:
    """One round of the sampled Gaussian mechanism: each unit sampled w.p. q, noise z * sensitivity."""
    return dp_accounting.PoissonSampledDpEvent(sampling_probability, dp_accounting.GaussianDpEvent(noise_multiplier))


def group_replace_round(sampling_probability: float, noise_multiplier: float, group_size: int
                        ) -> dp_accounting.DpEvent:
    """One round in which changing a privacy unit changes up to ``group_size`` contributions, each
    sampled by its own coin with probability q and each moved from one vector of norm <= 1 (in units of
    the clip) to another, under one Gaussian of std ``z`` (uedp-bounded's (user, entity) group).

    Conservative, by post-processing: split the noise into ``g`` independent shares of std ``z / sqrt(g)``
    and pair each changed contribution with one share. The round's output is the sum of ``g`` independent
    releases (plus what the unit does not change), each a Poisson-sampled Gaussian under replace-one
    adjacency with noise multiplier ``z / sqrt(g)``; the sum is post-processing of those releases, so
    their g-fold composition bounds the round. Exact for q = 1 (one Gaussian of sensitivity 2g); for
    small q it gives up part of the amplification by sampling (docs/PRIVACY.md, uedp-bounded).
    """
    if group_size < 1:
        raise ValueError(f"group size must be >= 1, got {group_size}")
    single = poisson_gaussian_round(sampling_probability, noise_multiplier / math.sqrt(group_size))
    return single if group_size == 1 else dp_accounting.SelfComposedDpEvent(single, group_size)


def delta_noise_multiplier(noise_multiplier: float, bit_noise_multiplier: float) -> float:
    """The update's noise multiplier ``z_Delta`` when a round also releases a Gaussian count of the same
    sampled units with noise multiplier ``bit_noise_multiplier`` (its noise std over its sensitivity),
    chosen so that the two together are accounted as one Gaussian of ``noise_multiplier`` z:
    ``z_Delta = (z^-2 - z_b^-2)^(-1/2)`` (adaptive clipping: Andrew et al. 2021, Theorem 1).

    Why it is exact: divide each query by its noise std. One unit then adds the vector
    ``(x / (z_Delta C), b / sigma_b)`` (its clipped delta, its count term) to a sum that carries
    ``N(0, I)``; its norm is at most ``(z_Delta^-2 + z_b^-2)^(1/2) = 1 / z`` and one sampling coin decides
    both parts. The Gaussian's privacy loss sees the contributions only through that bound (the same
    argument that lets a many-dimensional clipped delta be accounted as one Gaussian), so a round is the
    event a fixed clip with noise z gives: adaptive clipping spends nothing beyond z. dp_accounting's RDP accountant applies the same reduction
    to ``PoissonSampled(q, Composed([Gaussian(z_Delta), Gaussian(z_b)]))``; its PLD accountant does not
    take that event, so the equality is checked numerically (tests/test_adaptive_clipping.py)."""
    if not (noise_multiplier > 0 and math.isfinite(bit_noise_multiplier)):
        raise ValueError(f"noise multipliers must be positive and finite, got {noise_multiplier}, {bit_noise_multiplier}")
    if not bit_noise_multiplier > noise_multiplier:
        raise ValueError(f"the count's noise multiplier {bit_noise_multiplier:.4g} must exceed the round's noise "
                         f"multiplier {noise_multiplier:.4g}: the count alone would spend more than the whole round")
    return float((noise_multiplier ** -2 - bit_noise_multiplier ** -2) ** -0.5)


def with_initial(event: dp_accounting.DpEvent, initial: dp_accounting.DpEvent | None) -> dp_accounting.DpEvent:
    """``event`` preceded by a one-time release (a DP count of the units), composed, when there is one."""
    return event if initial is None else dp_accounting.ComposedDpEvent([initial, event])


def epsilon_after(round_event: dp_accounting.DpEvent, rounds: int, delta: float, kind: AccountantKind = "pld",
                  adjacency: Adjacency = "add_remove", initial: dp_accounting.DpEvent | None = None,
                  discretization: float | None = None) -> float:
    """Epsilon after ``rounds`` self-composed rounds at ``delta``, after the one-time ``initial`` release
    (remembered by its exact arguments: :mod:`privacy.accounting.memo`)."""
    if rounds <= 0 and initial is None:
        return 0.0
    arguments = (repr(round_event), rounds, delta, kind, adjacency, repr(initial), discretization)
    return float(remembered("epsilon", arguments, lambda: _epsilon_after(round_event, rounds, delta, kind, adjacency,
                                                                         initial, discretization)))


def _epsilon_after(round_event: dp_accounting.DpEvent, rounds: int, delta: float, kind: AccountantKind,
                   adjacency: Adjacency, initial: dp_accounting.DpEvent | None, discretization: float | None) -> float:
    accountant = make_accountant(kind, adjacency, discretization)

    def compose() -> float:
        if rounds <= 0:
            accountant.compose(initial)
        else:
            accountant.compose(with_initial(dp_accounting.SelfComposedDpEvent(round_event, rounds), initial))
        return float(accountant.get_epsilon(delta))

    return fits_in_memory(compose)
