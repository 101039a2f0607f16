"""The round loop's accounting, planned before round 1: :class:`RoundAccountant` composes one event per
round, and :class:`EpsilonSchedule` says where a budget stops the run and the exact epsilon of the rounds
it shows, so training itself composes nothing."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dp_accounting

from uedp.privacy.accounting.events import (
    AccountantKind,
    Adjacency,
    epsilon_after,
    fits_in_memory,
    make_accountant,
    neighboring_relation,
)
from uedp.privacy.accounting.memo import remembered

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

    All the accounting of a run is done by :meth:`schedule_for`, before its first round: the budget stop and the
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

    def schedule_for(self, rounds: int, budget: float | None = None) -> EpsilonSchedule:
        """Before the first round: the schedule of a run of ``rounds`` rounds stopped by ``budget``."""
        return schedule_epsilons([self], rounds, budget)

    def final(self, rounds: int, budget: float | None = None) -> float:
        """The epsilon a run of ``rounds`` rounds under ``budget`` states if it is not interrupted: its
        schedule's last figure, found without planning the curve when the budget does not stop it."""
        return planned_final([self], rounds, budget)

    def spend(self) -> float | None:
        """One round ran: the exact epsilon after it when the schedule shows that round, else None. No
        accounting happens here (:meth:`schedule_for` did it)."""
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
        self._one_round = (fits_in_memory(lambda: _round_pld(self.round_event, self.adjacency))
                           if self.kind == "pld" else None)
        initial = self.initial
        initial_pld = (fits_in_memory(lambda: _gaussian_pld(initial, self.adjacency))
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
        composed = knot if power is None else power if knot is None else fits_in_memory(lambda: knot.compose(power))
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
            self._powers[k] = one if k == 1 else fits_in_memory(lambda: one.self_compose(k))
        return self._powers[k]

    def _settle(self, schedule: EpsilonSchedule) -> None:
        """Keep the schedule's figures and let the PLDs go (megabytes each)."""
        self.schedule = schedule
        self._exact = dict(schedule.shown)
        self._one_round, self._knot, self._probe, self._powers = None, (0, None), (0, None), {}


def whole_run_epsilon(accountants: Sequence[RoundAccountant], rounds: int) -> list[float]:
    """Each accountant's epsilon after all ``rounds``, by :func:`epsilon_after` in one composition (the
    figure a calibration computed for the same event, remembered): the last figure of a run the budget
    does not stop."""
    return [epsilon_after(a.round_event, rounds, a.delta, a.kind, a.adjacency, a.initial) for a in accountants]


def planned_final(accountants: Sequence[RoundAccountant], rounds: int, budget: float | None) -> float:
    """The last figure of the schedule :func:`schedule_epsilons` plans, without planning the curve when the
    budget does not stop the run (``uedp epsilon`` and a reservation need only this figure)."""
    if rounds > 0:
        finals = whole_run_epsilon(accountants, rounds)
        if budget is None or max(finals) <= budget:
            return max(finals)
    schedule = schedule_epsilons(accountants, rounds, budget)
    return schedule.shown.get(schedule.last, max(a.exact_after(schedule.last) for a in accountants))


def schedule_epsilons(accountants: Sequence[RoundAccountant], rounds: int, budget: float | None) -> EpsilonSchedule:
    """The schedule of a run of ``rounds`` rounds whose epsilon is the largest of ``accountants``' (see
    :func:`_schedule_epsilons`), remembered by the accountants' identities, the rounds and the budget
    (:mod:`privacy.accounting.memo`): a sweep or a test suite plans the same run many times."""
    arguments = (tuple(tuple(sorted(a._identity().items())) for a in accountants), rounds, budget)

    def computed() -> dict[str, Any]:
        schedule = _schedule_epsilons(accountants, rounds, budget)
        return {"last": schedule.last, "cases": [[[r, e] for r, e in a.schedule.shown.items()]
                                                 for a in accountants if a.schedule is not None]}

    planned = remembered("schedule", arguments, computed)
    cases = [{int(r): float(e) for r, e in case} for case in planned["cases"]]
    for accountant, case in zip(accountants, cases):  # each takes its own figures (computed or remembered)
        accountant._settle(EpsilonSchedule(rounds, int(planned["last"]), case))
    return EpsilonSchedule(rounds, int(planned["last"]),
                           {at: max(case[at] for case in cases) for at in cases[0]} if cases else {})


def _schedule_epsilons(accountants: Sequence[RoundAccountant], rounds: int, budget: float | None) -> EpsilonSchedule:
    """The schedule of a run of ``rounds`` rounds whose epsilon is the largest of ``accountants``' (one, or
    uedp's cases), stopped by ``budget`` (None: no budget); each accountant is given its own figures at
    the same rounds, the same last round.

    A run the budget does not stop (no budget, or every case's whole-run figure within it) ends on the
    whole run's figure composed at once (:func:`whole_run_epsilon`: the calibration's, and what
    :func:`planned_final` reports without the curve), and no earlier figure is put above it: a figure
    for fewer rounds is still an upper bound when lowered to that of more rounds, since a transcript of
    fewer rounds is post-processing of a longer one's.

    Otherwise it walks the shown rounds (:func:`shown_rounds`) in order, each figure composed from the one
    before; at the first whose epsilon exceeds the budget, bisects between it and the last within the
    budget (the largest of non-decreasing epsilons does not decrease, so bisection finds the exact last
    round R with epsilon(R) <= budget) and stops there. No figure is put below the one before it in the
    same case (see :meth:`RoundAccountant.exact_after`), so the figures compared with the budget are
    those shown.
    """
    finals = whole_run_epsilon(accountants, rounds) if rounds > 0 else []
    if finals and (budget is None or max(finals) <= budget):
        budget, ceilings = None, finals
    else:
        ceilings = [math.inf for _ in accountants]
    for accountant in accountants:
        accountant._start_planning()
    shown: list[dict[int, float]] = [{} for _ in accountants]
    floors = [0.0 for _ in accountants]

    def figures(at: int) -> list[float]:
        if at == rounds and budget is None:
            return ceilings
        return [max(min(a._planned_at(at), ceiling), floor) for a, ceiling, floor in zip(accountants, ceilings, floors)]

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
        value_discretization_interval=PLD_DISCRETIZATION, neighboring_relation=neighboring_relation(adjacency))
    return pld


def _gaussian_pld(event: dp_accounting.DpEvent, adjacency: Adjacency) -> object | None:
    """dp_accounting's PLD of one unsampled Gaussian release (the DP count of units)."""
    if not isinstance(event, dp_accounting.GaussianDpEvent):
        return None
    from dp_accounting.pld import privacy_loss_distribution

    pld: object = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=event.noise_multiplier, value_discretization_interval=PLD_DISCRETIZATION,
        neighboring_relation=neighboring_relation(adjacency))
    return pld


PLD_DISCRETIZATION = 1e-4  # dp_accounting's PLDAccountant default
