"""Privacy accounting behind one small interface, computed by ``dp_accounting`` (never by hand).

A mechanism describes one training round as a ``DpEvent``; :class:`RoundAccountant` composes one per
round and reports ``(epsilon, delta)`` after each. ``pld`` (privacy loss distributions) gives the
tightest figure and is the default for reported numbers; ``rdp`` (Renyi DP) is faster and looser.
Both are upper bounds, so both are sound to report; the run says which one it used.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

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


class RoundAccountant:
    """Composes one identical ``DpEvent`` per round; ``epsilon`` is exact for the rounds run so far.

    ``step`` spends a round and returns the epsilon to report for it; ``would_exceed(budget)`` tells,
    before a round, whether running it would take epsilon past ``budget`` (exactly), so training stops
    *before* such a round (nothing is released for a round that does not run).

    Speed. Computing epsilon costs tens of milliseconds (a composition and a search over the privacy
    loss distribution), as much as a training step of a small model, so with ``pld`` and a
    Poisson-sampled Gaussian round (all of DP-SGD, DP-FedAvg and uedp's cases) the one-round PLD is
    built once by dp_accounting and composed in *blocks*: a block is ``k`` rounds, ``k`` the largest
    power of two at most ``rounds / 4``, composed at once (``self_compose(k)``, cached per ``k``). A
    round's report is the epsilon at the end of its block: exact at a block's end, and within a block
    an upper bound (epsilon never decreases with rounds): the epsilon of at most 25% more rounds, about
    12% more epsilon where it grows as the square root of the rounds. The budget stop and ``epsilon`` (what the statement reports) are always exact. A run of T rounds
    computes epsilon about ``8 + 4 log2(T / 8)`` times, not T times.
    """

    BLOCK_DIVISOR = 4  # a block is at most 1/4 of the rounds before it

    def __init__(self, round_event: dp_accounting.DpEvent, delta: float, kind: AccountantKind = "pld",
                 adjacency: Adjacency = "add_remove", initial: dp_accounting.DpEvent | None = None):
        make_accountant(kind, adjacency)  # fails early on a combination dp_accounting cannot account
        self.round_event = round_event
        self.initial = initial  # a one-time release before round 1 (a DP count of the units), or None
        self.delta = delta
        self.kind: AccountantKind = kind
        self.adjacency: Adjacency = adjacency
        self.rounds = 0
        self._one_round = _fits_in_memory(lambda: _round_pld(round_event, adjacency)) if kind == "pld" else None
        initial_pld = (_fits_in_memory(lambda: _gaussian_pld(initial, adjacency))
                       if self._one_round is not None and initial is not None else None)
        if self._one_round is not None and initial is not None and initial_pld is None:
            self._one_round = None  # an initial release PLD cannot build incrementally: recompose each time
        self._powers: dict[int, Any] = {}  # k -> the PLD of k rounds
        self._knot, self._knot_pld = 0, cast(Any, initial_pld)  # the exact PLD after ``_knot`` rounds (None: nothing yet)
        self._block_end, self._block_pld, self._block_epsilon = 0, cast(Any, initial_pld), 0.0
        self._fine = False  # one-round blocks, once the budget is near
        self._exact: dict[int, float] = {}

    @property
    def epsilon(self) -> float:
        """Exact epsilon after the rounds run so far (and the initial release)."""
        return self.exact_after(self.rounds)

    def exact_after(self, rounds: int) -> float:
        if rounds not in self._exact:
            if self._one_round is None or rounds < self._knot:
                value = epsilon_after(self.round_event, rounds, self.delta, self.kind, self.adjacency, self.initial)
            elif rounds == 0 and self._knot_pld is None:
                value = 0.0
            else:
                value = float(self._pld_after(rounds).get_epsilon_for_delta(self.delta))
            self._exact = {r: e for r, e in self._exact.items() if r >= self.rounds} | {rounds: value}
        return self._exact[rounds]

    def _power(self, k: int) -> Any:
        """The PLD of k rounds; block lengths (powers of two) are kept, other lengths (an exact figure
        inside a block) are not, so the cache stays small over any number of rounds."""
        if k in self._powers:
            return self._powers[k]
        one = self._one_round
        power = one if k == 1 else _fits_in_memory(lambda: one.self_compose(k))  # type: ignore[attr-defined]
        if k & (k - 1) == 0:
            self._powers[k] = power
        return power

    def _pld_after(self, rounds: int) -> Any:
        extra = rounds - self._knot
        if extra == 0:
            return self._knot_pld
        power = self._power(extra)
        knot = self._knot_pld
        return power if knot is None else _fits_in_memory(lambda: knot.compose(power))

    def _bound_after_next(self) -> float:
        """An upper bound of epsilon after one more round (the end of the block that round falls in)."""
        if self._one_round is None:
            return self.exact_after(self.rounds + 1)
        if self.rounds >= self._block_end:
            k = 1 if self._fine else 1 << max(0, (self.rounds // self.BLOCK_DIVISOR).bit_length() - 1)
            self._block_end, self._block_pld = self.rounds + k, self._pld_after(self.rounds + k)
            self._block_epsilon = float(self._block_pld.get_epsilon_for_delta(self.delta))
            self._exact[self._block_end] = self._block_epsilon
        return self._block_epsilon

    def would_exceed(self, budget: float) -> bool:
        """Whether epsilon after one more round would be above ``budget`` (exact, not the block's bound)."""
        if self._bound_after_next() <= budget:
            return False
        if self._one_round is not None and self._block_end > self.rounds + 1:  # near the budget: round by round
            self._fine = True
            self._block_end, self._block_pld = self.rounds + 1, self._pld_after(self.rounds + 1)
            self._block_epsilon = float(self._block_pld.get_epsilon_for_delta(self.delta))
        return self.exact_after(self.rounds + 1) > budget

    def peek(self) -> float:
        """Exact epsilon after one more round, without spending it."""
        return self.exact_after(self.rounds + 1)

    def step(self) -> float:
        """Spend one round; returns the epsilon to report for it (exact, or its block's upper bound)."""
        report = self._bound_after_next()
        self.rounds += 1
        if self._one_round is not None and self.rounds == self._block_end:
            self._knot, self._knot_pld = self.rounds, self._block_pld
        return report

    def state_dict(self) -> dict[str, object]:
        """The rounds composed so far, with what identifies the round event, for checkpoints."""
        return {"rounds": self.rounds, "epsilon": self.epsilon, "event": repr(self.round_event),
                "initial": repr(self.initial), "delta": self.delta, "kind": self.kind, "adjacency": self.adjacency}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Continue after ``state['rounds']`` rounds, recomposed in blocks. A run that had gone round by round
        near its budget resumes with the regular blocks, so a resumed epsilon can differ from the
        uninterrupted one in the last digits (both are dp_accounting's pessimistic PLD figures)."""
        mine = {"event": repr(self.round_event), "initial": repr(self.initial), "delta": self.delta, "kind": self.kind,
                "adjacency": self.adjacency}
        if any(state.get(key) != value for key, value in mine.items()):
            raise ValueError(f"accountant state of another mechanism ({state['event']}, delta {state['delta']}, "
                             f"{state['kind']}) cannot continue this one ({mine['event']})")
        fresh = RoundAccountant(self.round_event, self.delta, self.kind, self.adjacency, self.initial)
        for _ in range(int(state["rounds"]) if fresh._one_round is not None else 0):  # type: ignore[call-overload]
            fresh.step()
        fresh.rounds = int(state["rounds"])  # type: ignore[call-overload]
        self.__dict__.update(fresh.__dict__)


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
        """One incremental accountant per case, for per-round epsilon during training (the max of them)."""
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
