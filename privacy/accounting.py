"""Privacy accounting behind one small interface, computed by ``dp_accounting`` (never by hand).

A mechanism describes one training round as a ``DpEvent``; :class:`RoundAccountant` composes one per
round. A run's accounting is planned before its first round (:class:`EpsilonSchedule`: where a budget
stops it, the exact epsilon of the rounds it shows), so training itself composes nothing. ``pld``
(privacy loss distributions) gives the tightest figure and is the default for reported numbers; ``rdp``
(Renyi DP) is faster and looser. Both are upper bounds, so both are sound to report; the run says which
one it used.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import dp_accounting
from dp_accounting import pld, rdp

if TYPE_CHECKING:
    from uedp.privacy.population import Population

AccountantKind = Literal["pld", "rdp"]
ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")
# Adjacency of the privacy unit: "add_remove" (a unit present or absent: users, sequences) or "replace"
# (a unit's value changed, its place kept: Selective DP's F-neighbours, one sensitive token's value).
# dp_accounting's REPLACE_ONE models records bounded by the sensitivity on either side, sampled by the
# same coin, so a clipped contribution of norm <= beta needs no extra factor 2 here. Only PLD supports
# it for Poisson sampling.
Adjacency = Literal["add_remove", "replace"]
T = TypeVar("T")
MIN_NOISE_MULTIPLIER = 0.3

# dp_accounting's RDP code logs a warning for every fractional order it cannot evaluate; those orders
# are excluded from the minimum, which keeps the bound valid. Keep them out of users' terminals.
logging.getLogger("absl").setLevel(logging.ERROR)


PLD_OUT_OF_MEMORY = ("the PLD accountant ran out of memory discretising this little noise ({detail}); "
                     f"below a noise multiplier of about {MIN_NOISE_MULTIPLIER:g} epsilon is in the hundreds anyway: "
                     "give more noise (or a target epsilon), or use the rdp accountant")


def _fits_in_memory(compute: Callable[[], T]) -> T:
    """Run a PLD computation, turning numpy's out-of-memory error (the discretisation of a privacy loss
    distribution grows as the noise shrinks: 38 GiB at z = 0.001) into a ValueError that says what to do."""
    try:
        return compute()
    except MemoryError as exc:
        raise ValueError(PLD_OUT_OF_MEMORY.format(detail=str(exc).split(" for an array")[0] or "MemoryError")) from None


def make_accountant(kind: AccountantKind, adjacency: Adjacency = "add_remove") -> dp_accounting.PrivacyAccountant:
    relation = _relation(adjacency)
    if kind == "pld":
        return pld.PLDAccountant(relation)
    if kind == "rdp":
        if adjacency == "replace":
            raise ValueError("the rdp accountant cannot account replace-one adjacency under Poisson sampling; use pld")
        return rdp.RdpAccountant()
    raise ValueError(f"unknown accountant {kind!r}; valid: {', '.join(ACCOUNTANTS)}")


def _relation(adjacency: Adjacency) -> dp_accounting.NeighboringRelation:
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
                  adjacency: Adjacency = "add_remove", initial: dp_accounting.DpEvent | None = None) -> float:
    """Epsilon after ``rounds`` self-composed rounds at ``delta``, after the one-time ``initial`` release."""
    if rounds <= 0 and initial is None:
        return 0.0
    accountant = make_accountant(kind, adjacency)

    def compose() -> float:
        if rounds <= 0:
            accountant.compose(initial)
        else:
            accountant.compose(with_initial(dp_accounting.SelfComposedDpEvent(round_event, rounds), initial))
        return float(accountant.get_epsilon(delta))

    return _fits_in_memory(compose)


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


# A run shows the exact epsilon of at most this many rounds (every round of a shorter run). Each figure is a
# PLD composition and search (about 0.09 s on one core), all paid before round 1: 20 figures keep a short
# run's start within about 2 s and still draw the curve.
SHOWN_ROUNDS = 20
FIRST_SHOWN = 4  # the first rounds, where epsilon grows fastest, are all shown


def shown_rounds(rounds: int) -> list[int]:
    """The rounds of a ``rounds``-round run whose exact epsilon is shown: every round of a run of at most
    ``SHOWN_ROUNDS``; otherwise the first ``FIRST_SHOWN`` and evenly spaced ones after them (the gaps
    differ by at most one round, so incremental composition reuses two powers of the one-round PLD),
    ending at the last round: ``SHOWN_ROUNDS`` in all."""
    if rounds <= SHOWN_ROUNDS:
        return list(range(1, rounds + 1))
    span, points = rounds - FIRST_SHOWN, SHOWN_ROUNDS - FIRST_SHOWN
    return [*range(1, FIRST_SHOWN + 1), *(FIRST_SHOWN + (k * span + points // 2) // points for k in range(1, points + 1))]


@dataclass(frozen=True)
class EpsilonSchedule:
    """A run's accounting, fixed before its first round (it is a function of the configuration alone).

    ``last`` is the last round that runs: ``planned``, or fewer when a budget stops the run (the largest
    R with epsilon(R) <= budget). ``shown`` maps the rounds whose epsilon is reported (see
    :func:`shown_rounds`, cut at ``last`` and with ``last`` added) to their exact epsilon; the figures do
    not decrease, and the one at ``last`` is the run's final epsilon. Between shown rounds no figure is
    reported (the last shown one is below the truth there, the next one above it).
    """

    planned: int
    last: int
    shown: Mapping[int, float] = field(default_factory=dict)

    @property
    def stopped_by_budget(self) -> bool:
        return self.last < self.planned


class RoundAccountant:
    """Composes one identical ``DpEvent`` per round (after an optional one-time ``initial`` release).

    All the accounting of a run is done by :meth:`plan`, before its first round: the budget stop and the
    exact epsilon of every shown round (:class:`EpsilonSchedule`). During training :meth:`spend` only
    counts a round and hands on the figure the schedule holds for it (None between shown rounds), so no
    privacy loss distribution is composed on the hot path. ``epsilon`` is exact for the rounds spent: the
    schedule's figure, or computed when asked (a run interrupted between shown rounds).

    Speed. Epsilon by PLD costs 0.05 to 0.3 s (a composition and a search over a discretised privacy
    loss distribution of 10^5 to 10^6 points), as much as a training step of a small model. With
    ``pld`` and a Poisson-sampled Gaussian round (DP-SGD, DP-FedAvg and uedp's cases) the one-round PLD
    is built once by dp_accounting and the shown rounds are composed incrementally, each from the one
    before (``knot.compose(one.self_compose(gap))``; the evenly spaced gaps share two powers); the stop
    is found by bisection between the last shown round within the budget and the first beyond it,
    composing from the former. Other events (``rdp``, a round or an initial release without such a
    PLD) ask :func:`epsilon_after` for each figure. A run plans at most ``SHOWN_ROUNDS`` figures plus
    about ``log2(rounds / SHOWN_ROUNDS)`` bisection steps.
    """

    def __init__(self, round_event: dp_accounting.DpEvent, delta: float, kind: AccountantKind = "pld",
                 adjacency: Adjacency = "add_remove", initial: dp_accounting.DpEvent | None = None):
        make_accountant(kind, adjacency)  # fails early on a combination dp_accounting cannot account
        self.round_event = round_event
        self.initial = initial  # a one-time release before round 1 (a DP count of the units), or None
        self.delta = delta
        self.kind: AccountantKind = kind
        self.adjacency: Adjacency = adjacency
        self.rounds = 0
        self.schedule: EpsilonSchedule | None = None  # set by ``plan``
        self._exact: dict[int, float] = {}  # rounds -> exact epsilon, for the rounds figured so far
        self._incremental = False
        self._one_round: Any = None
        self._knot: tuple[int, Any] = (0, None)  # while planning: (rounds, their PLD), None for nothing yet
        self._probe: tuple[int, Any] = (0, None)  # the PLD last composed while planning
        self._powers: dict[int, Any] = {}  # k -> the PLD of k rounds, the last two composed

    @property
    def epsilon(self) -> float:
        """Exact epsilon after the rounds spent (and the initial release)."""
        return self.exact_after(self.rounds)

    def exact_after(self, rounds: int) -> float:
        """Exact epsilon after ``rounds``: the schedule's figure for a shown round, otherwise computed now
        by :func:`epsilon_after` and kept. A figure is never put below one already known for fewer
        rounds (epsilon does not decrease with rounds; composing in another order can move dp_accounting's
        figure in its ninth digit, and raising an upper bound keeps it one)."""
        if rounds not in self._exact:
            value = epsilon_after(self.round_event, rounds, self.delta, self.kind, self.adjacency, self.initial)
            self._exact[rounds] = max([value, *(e for r, e in self._exact.items() if r < rounds)])
        return self._exact[rounds]

    def plan(self, rounds: int, budget: float | None = None) -> EpsilonSchedule:
        """Before the first round: the schedule of a run of ``rounds`` rounds stopped by ``budget``."""
        return plan_epsilons([self], rounds, budget)

    def spend(self) -> float | None:
        """One round ran: the exact epsilon after it when the schedule shows that round, else None. No
        accounting happens here (:meth:`plan` did it)."""
        self.rounds += 1
        return None if self.schedule is None else self.schedule.shown.get(self.rounds)

    def state_dict(self) -> dict[str, object]:
        """The rounds spent, with what identifies the round event, for checkpoints. The schedule is not
        kept: it is a function of the configuration, planned again on resuming."""
        return {"rounds": self.rounds, **self._identity()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Continue after ``state['rounds']`` rounds of the same event; another mechanism's state is refused."""
        mine = self._identity()
        if any(state.get(key) != value for key, value in mine.items()):
            raise ValueError(f"accountant state of another mechanism ({state['event']}, delta {state['delta']}, "
                             f"{state['kind']}) cannot continue this one ({mine['event']})")
        self.rounds = int(state["rounds"])  # type: ignore[call-overload]

    def _identity(self) -> dict[str, object]:
        return {"event": repr(self.round_event), "initial": repr(self.initial), "delta": self.delta,
                "kind": self.kind, "adjacency": self.adjacency}

    # --- planning: a cursor over rounds that composes from the last round kept --------------------------

    def _start_planning(self) -> None:
        """Build the one-round PLD (and the initial release's) when dp_accounting can compose them
        incrementally; otherwise every figure comes from :func:`epsilon_after`."""
        self._one_round = (_fits_in_memory(lambda: _round_pld(self.round_event, self.adjacency))
                           if self.kind == "pld" else None)
        initial = self.initial
        initial_pld = (_fits_in_memory(lambda: _gaussian_pld(initial, self.adjacency))
                       if self._one_round is not None and initial is not None else None)
        self._incremental = self._one_round is not None and (initial is None or initial_pld is not None)
        self._knot = self._probe = (0, initial_pld)

    def _planned_at(self, rounds: int) -> float:
        """Exact epsilon after ``rounds`` (no fewer than the round kept), composed from the round kept."""
        if not self._incremental:
            return epsilon_after(self.round_event, rounds, self.delta, self.kind, self.adjacency, self.initial)
        kept, knot = self._knot
        if rounds < kept:
            raise ValueError(f"planning composes forward: {rounds} rounds is before the {kept} kept")
        power = self._power_of(rounds - kept) if rounds > kept else None
        composed = knot if power is None else power if knot is None else _fits_in_memory(lambda: knot.compose(power))
        self._probe = (rounds, composed)
        return 0.0 if composed is None else float(composed.get_epsilon_for_delta(self.delta))

    def _keep(self, rounds: int) -> None:
        """Later figures compose from ``rounds`` (whose PLD was the last composed)."""
        if self._incremental and self._probe[0] == rounds:
            self._knot = self._probe

    def _power_of(self, k: int) -> Any:
        """The PLD of k rounds; the last two are kept (the gaps between shown rounds take two lengths)."""
        if k not in self._powers:
            one = self._one_round
            if len(self._powers) >= 2:
                del self._powers[next(iter(self._powers))]
            self._powers[k] = one if k == 1 else _fits_in_memory(lambda: one.self_compose(k))
        return self._powers[k]

    def _settle(self, schedule: EpsilonSchedule) -> None:
        """Keep the schedule's figures and let the PLDs go (megabytes each)."""
        self.schedule = schedule
        self._exact = dict(schedule.shown)
        self._one_round, self._knot, self._probe, self._powers = None, (0, None), (0, None), {}


def plan_epsilons(accountants: Sequence[RoundAccountant], rounds: int, budget: float | None) -> EpsilonSchedule:
    """The schedule of a run of ``rounds`` rounds whose epsilon is the largest of ``accountants``' (one, or
    uedp's cases), stopped by ``budget`` (None: no budget); each accountant is given its own figures at
    the same rounds, the same last round.

    Walks the shown rounds (:func:`shown_rounds`) in order, each figure composed from the one before; at
    the first whose epsilon exceeds the budget, bisects between it and the last within the budget (the
    largest of non-decreasing epsilons does not decrease, so bisection finds the exact last round R with
    epsilon(R) <= budget) and stops there. No figure is put below the one before it in the same case
    (see :meth:`RoundAccountant.exact_after`), so the figures compared with the budget are those shown.
    """
    for accountant in accountants:
        accountant._start_planning()
    shown: list[dict[int, float]] = [{} for _ in accountants]
    floors = [0.0 for _ in accountants]

    def figures(at: int) -> list[float]:
        return [max(a._planned_at(at), floor) for a, floor in zip(accountants, floors)]

    def record(at: int, values: list[float]) -> None:
        for case, value in zip(shown, values):
            case[at] = value
        floors[:] = values

    kept, last = 0, rounds
    for at in shown_rounds(rounds):
        values = figures(at)
        if budget is not None and max(values) > budget:
            low, high, low_values = kept, at, None
            while high - low > 1:  # epsilon(low) <= budget (or low = 0: the run may stop before round 1)
                middle = (low + high) // 2
                middle_values = figures(middle)
                if max(middle_values) <= budget:
                    low, low_values = middle, middle_values
                else:
                    high = middle
            last = low
            if low_values is not None:
                record(low, low_values)
            break
        record(at, values)
        for accountant in accountants:
            accountant._keep(at)
        kept = at
    for accountant, case in zip(accountants, shown):
        accountant._settle(EpsilonSchedule(rounds, last, case))
    return EpsilonSchedule(rounds, last, {at: max(case[at] for case in shown) for at in shown[0]} if shown else {})


@functools.lru_cache(maxsize=16)  # uedp builds one per case; sweeps and tests rebuild the same ones
def _round_pld(event: dp_accounting.DpEvent, adjacency: Adjacency) -> object | None:
    """dp_accounting's PLD of one Poisson-sampled Gaussian round (or of a fixed number of them composed),
    built as its PLDAccountant builds it."""
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        single = _round_pld(event.event, adjacency)
        return None if single is None else single.self_compose(event.count)  # type: ignore[attr-defined]
    if not (isinstance(event, dp_accounting.PoissonSampledDpEvent)
            and isinstance(event.event, dp_accounting.GaussianDpEvent)):
        return None
    from dp_accounting.pld import privacy_loss_distribution

    pld: object = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=event.event.noise_multiplier, sampling_prob=event.sampling_probability,
        value_discretization_interval=PLD_DISCRETIZATION, neighboring_relation=_relation(adjacency))
    return pld


def _gaussian_pld(event: dp_accounting.DpEvent, adjacency: Adjacency) -> object | None:
    """dp_accounting's PLD of one unsampled Gaussian release (the DP count of units)."""
    if not isinstance(event, dp_accounting.GaussianDpEvent):
        return None
    from dp_accounting.pld import privacy_loss_distribution

    pld: object = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=event.noise_multiplier, value_discretization_interval=PLD_DISCRETIZATION,
        neighboring_relation=_relation(adjacency))
    return pld


PLD_DISCRETIZATION = 1e-4  # dp_accounting's PLDAccountant default
COUNT_BOUND_SHARE = 0.1  # uedp: share of delta charged to "the DP upper bound on the number of users fails"


# --- UeDP (PRIVACY.md, "UeDP-Alg, made sound") ------------------------------------------------------


def max_sampled_users(n_users: int, q_user: float, rounds: int, delta_trunc: float) -> int:
    """Smallest M with ``rounds * P[Binomial(n_users, q_user) > M] <= delta_trunc``.

    Poisson sampling has no hard bound on the number of users in a round; the mechanism keeps at most M
    (a uniformly random M when more are drawn), and the chance that truncation ever happens is charged
    to delta.
    """
    from scipy.stats import binom

    if not 0 < delta_trunc < 1:
        raise ValueError(f"truncation delta must be in (0, 1), got {delta_trunc}")
    low, high = 0, n_users
    while low < high:  # binom.sf is decreasing in M: bisect
        mid = (low + high) // 2
        if rounds * binom.sf(mid, n_users, q_user) <= delta_trunc:
            high = mid
        else:
            low = mid + 1
    return low


# Above this, e^epsilon overflows and a guarantee means nothing: uedp refuses to plan such a run.
MAX_UEDP_EPSILON = 500.0


def total_variation_factor(epsilon_bound: float) -> float:
    """``1 + e^epsilon``: what an event of probability p that breaks the sensitivity bound costs in delta.

    If a mechanism A agrees with an (epsilon, delta)-DP mechanism B except on an event of probability at
    most p (on either neighbour), then P[A(D) in S] <= P[B(D) in S] + p <= e^eps P[B(D') in S] + delta + p
    <= e^eps (P[A(D') in S] + p) + delta + p: A is (epsilon, delta + p (1 + e^epsilon))-DP. Charging p alone
    is not enough: once uedp's truncation evicts a user, the S case moves the sum by 4 beta, not 3."""
    if not epsilon_bound <= MAX_UEDP_EPSILON:
        raise ValueError(f"this run would report epsilon above {MAX_UEDP_EPSILON:g} (about {epsilon_bound:.3g}), "
                         "which guarantees nothing: give it more noise (or a target epsilon)")
    return 1.0 + math.exp(epsilon_bound)


class UeDpAccounting:
    """Epsilon of UeDP-Alg for the user-and-entity unit, as the larger of its two cases.

    E case (the added entity is detected): the round's output can change only if u' or e' is sampled,
    ``p_E = 1 - (1 - q_u)(1 - q_e)``, with sensitivity ``Delta_E = max(w) beta (2M + 1)``; the noise
    ``sigma = z Delta_E`` gives noise multiplier z. S case (an extended entity, one sentence of user v):
    ``p_S = 1 - (1 - q_u)(1 - q_u q_s)``, ``Delta_S = 3 max(w) beta``, noise multiplier
    ``z (2M + 1) / 3``. ``uedp-naive`` never trains on S sentences, so only the E case applies. Each case
    is the T-fold ``PoissonSampled(p, Gaussian(.))``, bounding every shift by the case's worst one
    (conservative), after the one-time DP count of users when the count is not public.

    M comes from ``n_users_bound + 1``: a public count or a DP upper bound on the number of (anchored)
    users (never the exact count under add/remove), plus the one user the larger neighbour adds. Two
    events break the sensitivity bound: some round draws more than M users (probability ``delta_trunc``),
    and the DP upper bound on N fails (``delta_bound``). Each costs ``p (1 + e^epsilon)`` of delta
    (:func:`total_variation_factor`), with epsilon the most the run can report (``epsilon_bound``), so
    ``delta = delta_accountant + (delta_trunc + delta_bound)(1 + e^epsilon_bound)``: the truncation's and
    the count bound's shares of delta are spent on ``p (1 + e^epsilon)``, and M is set from the (much
    smaller) p that leaves.
    """

    def __init__(self, n_users_bound: int, q_user: float, q_entity: float, q_extended: float, rounds: int,
                 delta: float, naive: bool = False, truncation_share: float = 0.1, kind: AccountantKind = "pld",
                 initial: dp_accounting.DpEvent | None = None, delta_bound: float = 0.0, *,
                 epsilon_bound: float):
        if not 0 < truncation_share < 1:
            raise ValueError("truncation_share must be in (0, 1)")
        factor = total_variation_factor(epsilon_bound)
        self.q_user, self.q_entity, self.q_extended = q_user, q_entity, q_extended
        self.rounds, self.naive, self.kind, self.initial = rounds, naive, kind, initial
        self.delta = delta
        self.epsilon_bound = epsilon_bound
        self.delta_trunc = truncation_share * delta / factor  # P[some round draws more than M users]
        self.delta_bound = delta_bound  # P[the DP upper bound on N fails]
        self.delta_accountant = delta - (self.delta_trunc + delta_bound) * factor
        if not self.delta_accountant > 0:
            raise ValueError("the truncation's and the count bound's shares leave no delta for the accountant")
        self.n_users_bound = n_users_bound
        # The larger of two neighbours has one user more than the count bounds.
        self.max_users = max_sampled_users(n_users_bound + 1, q_user, rounds, self.delta_trunc)

    @classmethod
    def for_population(cls, population: Population, q_user: float, q_entity: float, q_extended: float,
                       rounds: int, delta: float, naive: bool = False, truncation_share: float = 0.1,
                       kind: AccountantKind = "pld", count_bound_share: float = COUNT_BOUND_SHARE, *,
                       epsilon_bound: float) -> UeDpAccounting:
        """The accounting of a run whose user count is ``population`` and whose epsilon is at most
        ``epsilon_bound``: a declared count bounds N itself; a DP count is composed in, and its upper bound
        fails with probability ``count_bound_share * delta / (1 + e^epsilon_bound)``."""
        delta_bound = (count_bound_share * delta / total_variation_factor(epsilon_bound)
                       if population.source == "dp-count" else 0.0)
        return cls(population.upper_bound(delta_bound), q_user, q_entity, q_extended, rounds, delta, naive,
                   truncation_share, kind, initial=population.event(), delta_bound=delta_bound,
                   epsilon_bound=epsilon_bound)

    @classmethod
    def for_run(cls, population: Population, q_user: float, q_entity: float, q_extended: float, rounds: int,
                delta: float, naive: bool, truncation_share: float, kind: AccountantKind, count_bound_share: float,
                noise_multiplier: float | None, target_epsilon: float | None) -> tuple[UeDpAccounting, float]:
        """The accounting and noise multiplier of a run (training and ``uedp epsilon`` both build it here).

        M and the count bound depend on the epsilon the run will report, which depends on M (the S case).
        With a target, the target bounds the epsilon. With a given z, the epsilon at the smallest M any
        bound gives (``epsilon_bound = 0``) bounds it: a larger M only adds noise to the S case and leaves
        the E case alone. The run's epsilon is checked against the bound it was planned with."""
        settings = (population, q_user, q_entity, q_extended, rounds, delta, naive, truncation_share, kind,
                    count_bound_share)
        if target_epsilon is not None:
            accounting = cls.for_population(*settings, epsilon_bound=target_epsilon)
            z = accounting.calibrate(target_epsilon)
        elif noise_multiplier is not None and noise_multiplier > 0:
            z = noise_multiplier
            provisional = cls.for_population(*settings, epsilon_bound=0.0)
            accounting = cls.for_population(*settings, epsilon_bound=provisional.epsilon(z))
        else:
            raise ValueError("needs a positive noise multiplier or a target epsilon")
        if accounting.epsilon(z) > accounting.epsilon_bound * (1 + 1e-9):
            raise RuntimeError(f"uedp's epsilon {accounting.epsilon(z):.6g} exceeds the bound "
                               f"{accounting.epsilon_bound:.6g} its truncation was planned with")
        return accounting, z

    @property
    def sensitivity_factor(self) -> int:
        """``Delta_E / (max(w) beta) = 2M + 1``."""
        return 2 * self.max_users + 1

    def case_events(self, noise_multiplier: float) -> dict[str, dp_accounting.DpEvent]:
        p_e = 1 - (1 - self.q_user) * (1 - self.q_entity)
        events = {"E": poisson_gaussian_round(p_e, noise_multiplier)}
        if not self.naive:
            p_s = 1 - (1 - self.q_user) * (1 - self.q_user * self.q_extended)
            events["S"] = poisson_gaussian_round(p_s, noise_multiplier * self.sensitivity_factor / 3)
        return events

    def epsilons(self, noise_multiplier: float, rounds: int | None = None) -> dict[str, float]:
        """Epsilon of each case after ``rounds`` (default: all) at the accountant's share of delta."""
        t = self.rounds if rounds is None else rounds
        return {case: epsilon_after(event, t, self.delta_accountant, self.kind, initial=self.initial)
                for case, event in self.case_events(noise_multiplier).items()}

    def epsilon(self, noise_multiplier: float, rounds: int | None = None) -> float:
        return max(self.epsilons(noise_multiplier, rounds).values())

    def round_accountants(self, noise_multiplier: float) -> dict[str, RoundAccountant]:
        """One accountant per case; the run's ledger plans them together (the stop is the first case's to
        exceed the budget, each shown figure the largest: :func:`plan_epsilons`)."""
        return {case: RoundAccountant(event, self.delta_accountant, self.kind, initial=self.initial)
                for case, event in self.case_events(noise_multiplier).items()}

    def calibrate(self, target_epsilon: float) -> float:
        """Smallest z meeting the target in every case: each case's epsilon falls as z grows, so the
        answer is the largest of the per-case calibrated values (each found by dp_accounting)."""
        zs = []
        for case in self.case_events(1.0):
            def event_for(z: float, case: str = case) -> dp_accounting.DpEvent:
                return self.case_events(z)[case]

            if epsilon_after(event_for(MIN_NOISE_MULTIPLIER), self.rounds, self.delta_accountant, self.kind,
                             initial=self.initial) <= target_epsilon:
                continue  # this case meets the target at any z the others need
            zs.append(calibrate_noise_multiplier(event_for, self.rounds, target_epsilon, self.delta_accountant,
                                                 self.kind, initial=self.initial))
        if not zs:
            raise ValueError(f"target epsilon {target_epsilon:g} is met even with noise multiplier "
                             f"{MIN_NOISE_MULTIPLIER}; give a noise multiplier instead")
        return max(zs)


def compose_guarantees(guarantees: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The ``(epsilon, delta)`` of running mechanisms that are each ``(epsilon_i, delta_i)``-DP for the same
    unit and adjacency, in any order and chosen adaptively (runs on one dataset: the privacy ledger).

    Each guarantee becomes the privacy loss distribution of the worst mechanism it allows
    (``dp_accounting``'s ``from_privacy_parameters``, pessimistically discretised) and dp_accounting
    composes them; the total is read at ``delta = sum(delta_i)``. That is the optimal composition of the
    stated guarantees (Kairouz, Oh and Viswanath 2015), never worse than adding the epsilons, and it
    needs nothing about the runs but what they stated. An infinite epsilon (a run without a guarantee)
    makes the total infinite; no guarantee composes to ``(0, 0)``.
    """
    if not guarantees:
        return 0.0, 0.0
    delta = float(sum(d for _, d in guarantees))
    if any(math.isinf(e) for e, _ in guarantees):
        return math.inf, delta
    if len(guarantees) == 1:
        return float(guarantees[0][0]), delta
    distributions = [pld.privacy_loss_distribution.from_privacy_parameters(
        pld.common.DifferentialPrivacyParameters(float(e), float(d))) for e, d in guarantees]
    composed = functools.reduce(lambda a, b: a.compose(b), distributions)
    # The discretisation rounds each loss up, so the composed figure may sit a hair above the plain sum,
    # which is itself a valid bound: report the smaller.
    return min(float(composed.get_epsilon_for_delta(delta)), float(sum(e for e, _ in guarantees))), delta
