"""uedp's worst-case accounting: the DP bound on how many users a round samples, and the epsilon of the
worse of uedp's two cases (a sampled entity, or only users), each computed by dp_accounting."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import dp_accounting

from uedp.privacy.accounting.calibration import MetAtFloor, calibrate_noise_multiplier
from uedp.privacy.accounting.events import (
    MIN_NOISE_MULTIPLIER,
    AccountantKind,
    epsilon_after,
    poisson_gaussian_round,
)
from uedp.privacy.accounting.rounds import RoundAccountant

if TYPE_CHECKING:
    from uedp.privacy.population import Population


COUNT_BOUND_SHARE = 0.1  # uedp: share of delta charged to "the DP upper bound on the number of users fails"


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
        exceed the budget, each shown figure the largest: :func:`schedule_epsilons`)."""
        return {case: RoundAccountant(event, self.delta_accountant, self.kind, initial=self.initial)
                for case, event in self.case_events(noise_multiplier).items()}

    def calibrate(self, target_epsilon: float) -> float:
        """Smallest z meeting the target in every case: each case's epsilon falls as z grows, so the
        answer is the largest of the per-case calibrated values (each found by dp_accounting)."""
        zs = []
        for case in self.case_events(1.0):
            def event_for(z: float, case: str = case) -> dp_accounting.DpEvent:
                return self.case_events(z)[case]

            try:
                zs.append(calibrate_noise_multiplier(event_for, self.rounds, target_epsilon, self.delta_accountant,
                                                     self.kind, initial=self.initial))
            except MetAtFloor:
                continue  # this case meets the target at any z the others need
        if not zs:
            raise ValueError(f"target epsilon {target_epsilon:g} is met even with noise multiplier "
                             f"{MIN_NOISE_MULTIPLIER}; give a noise multiplier instead")
        return max(zs)
