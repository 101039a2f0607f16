"""The planner's choice of a user-level run's sampling rate and rounds: for a target epsilon, a compute
budget and the number of users, the ``q_user`` and ``rounds`` whose averaged update is least noisy.

The compute budget is counted in **user updates**: rounds times the expected users per round
(``rounds * q_user * N``), the local training a run does, whatever its split into rounds. For a fixed
budget, more users per round means fewer rounds; at a target epsilon each split has its own calibrated
noise multiplier z (dp_accounting), hence its own noise-to-signal ``z * sensitivity / (clip * q N)``
(:mod:`privacy.signal`). Measured DP training prefers large cohorts and few steps at a fixed budget (the
noise-batch ratio of the VaultGemma scaling laws); a floor on the rounds keeps the model moving at all.

The choice is the candidate with the least noise-to-signal among splits with at least ``min_rounds``
rounds and at least ``MIN_COHORT`` expected users per round (ties: more rounds). The candidates are
shown with it, so a user sees what the budget could buy.

Privacy: the choice reads the configuration and the number of users N, which every plan reads: a public
count, or training's DP count (``Population``), never the data. So the choice is a function of public
values and changes nothing in what the run releases.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uedp.privacy.signal import NoiseToSignal

MIN_ROUNDS = 10  # fewer averaged updates barely move a model, however clean each is
MIN_COHORT = 10.0  # expected users per round at least: below, one user's clip is the whole signal
CANDIDATES = 8  # sampling rates tried, each sqrt(2) below the last
STEP = math.sqrt(2)


@dataclass(frozen=True)
class SamplingCandidate:
    """One split of the budget, planned at the target epsilon."""

    q_user: float
    rounds: int
    noise_multiplier: float
    signal: NoiseToSignal

    @property
    def users_per_round(self) -> float:
        return self.signal.units


@dataclass(frozen=True)
class SamplingChoice:
    """The chosen split and why, in words for the planner and the run."""

    q_user: float
    rounds: int
    reason: str
    candidates: tuple[SamplingCandidate, ...]

    def table(self) -> list[str]:
        """The candidates, one line each, the chosen one marked."""
        return [f"  {'*' if (c.q_user, c.rounds) == (self.q_user, self.rounds) else ' '} q_user {c.q_user:.3g}, "
                f"{c.rounds} rounds ({c.users_per_round:.4g} users a round): z = {c.noise_multiplier:.4g}, "
                f"noise-to-signal {c.signal.ratio:.3g}" for c in self.candidates]


def budget_of(rounds: int, q_user: float, users: float) -> float:
    """A configuration's compute budget in user updates: rounds times the expected users per round."""
    return rounds * q_user * users


@dataclass(frozen=True)
class ComputeBudget:
    """A budget of machine time, in user updates: ``hours`` of training at ``tokens_per_second`` (what
    ``benchmarks/train_throughput.py`` measures for the model on this machine), each user update reading at
    most ``tokens_per_update`` tokens (its contribution cap: local_steps x local_batch_size sequences of at
    most max_len tokens). Public: settings and a benchmark of public text, never the data."""

    hours: float
    tokens_per_second: float
    tokens_per_update: int

    def __post_init__(self) -> None:
        if not (self.hours > 0 and self.tokens_per_second > 0 and self.tokens_per_update > 0):
            raise ValueError("a compute budget needs positive hours, tokens a second and tokens an update")

    @property
    def user_updates(self) -> float:
        """The most user updates the time affords (every sequence at its full length: an upper bound on the
        tokens, so the run fits the time)."""
        return self.hours * 3600 * self.tokens_per_second / self.tokens_per_update

    def line(self) -> str:
        return (f"compute budget: {self.hours:g} h at {self.tokens_per_second:g} tokens/s, at most "
                f"{self.tokens_per_update:,} tokens a user update: {self.user_updates:,.0f} user updates")


def choose_sampling(plan: Callable[[float, int], tuple[float, NoiseToSignal]], users: float, budget: float,
                    min_rounds: int = MIN_ROUNDS) -> SamplingChoice:
    """The split of ``budget`` user updates among ``users`` (a public or DP count) with the least
    noise-to-signal. ``plan(q_user, rounds)`` is the mechanism's planner at the target epsilon: its z and
    noise-to-signal (a ``ValueError`` from it, e.g. a z the accountant cannot reach, skips that split)."""
    if users < 1 or budget <= 0 or min_rounds < 1:
        raise ValueError("choosing q_user needs at least one user, a positive budget and at least one round")
    top = min(1.0, budget / (users * min_rounds))
    if top * users < MIN_COHORT:
        raise ValueError(f"a budget of {budget:,.0f} user updates over {min_rounds} rounds gives fewer than "
                         f"{MIN_COHORT:g} users a round among {users:,.0f}: raise the budget (--rounds, --q-user) "
                         "or lower the least rounds")
    seen: list[SamplingCandidate] = []
    refused: list[str] = []
    q = top
    for _ in range(CANDIDATES):
        if q * users < MIN_COHORT:
            break
        rounds = max(min_rounds, round(budget / (q * users)))
        try:
            z, signal = plan(q, rounds)
        except ValueError as exc:
            refused.append(f"q_user {q:.3g}: {exc}")
        else:
            seen.append(SamplingCandidate(q, rounds, z, signal))
        q /= STEP
    if not seen:
        raise ValueError("no split of the budget could be planned: " + "; ".join(refused))
    best = min(seen, key=lambda c: (c.signal.ratio, -c.rounds))
    return SamplingChoice(best.q_user, best.rounds, _reason(best, seen, budget, min_rounds), tuple(seen))


def _reason(best: SamplingCandidate, seen: list[SamplingCandidate], budget: float, min_rounds: int) -> str:
    said = (f"q_user {best.q_user:.3g} and {best.rounds} rounds chosen: the least noise-to-signal "
            f"({best.signal.ratio:.3g}) of {len(seen)} splits of {budget:,.0f} user updates (rounds x expected users "
            f"a round) with at least {min_rounds} rounds")
    fewer = [c for c in seen if c.rounds > best.rounds]
    if fewer:
        other = min(fewer, key=lambda c: c.rounds)
        said += (f"; {other.rounds} rounds of {other.users_per_round:.4g} users would be at "
                 f"{other.signal.ratio:.3g}")
    if best.signal.past_limit:
        said += f"; even this is past {best.signal.limit:g}, where measured runs stopped learning"
    return said


def choose_for(plan: Callable[[Any, Any], Any], params: Any, population: Any, budget: float | None = None,
               rank_accountant: str | None = None, min_rounds: int = MIN_ROUNDS) -> tuple[Any, SamplingChoice]:
    """A user-level configuration's ``params`` with ``q_user`` and ``rounds`` replaced by the planner's split of
    ``budget`` (default: the configuration's own, rounds x q_user x the count of users), planned by the
    mechanism's ``plan(params, population)``. ``rank_accountant`` ranks the candidates with another
    accountant (rdp: milliseconds where PLD takes seconds a candidate); the run then plans its chosen split
    with its own. ``population`` is the public or DP count a run uses, so the choice reads nothing else."""
    if "q_user" not in type(params).model_fields:
        raise ValueError(f"the planner chooses a user-level run's q_user and rounds (userdp, uedp-bounded, uedp); "
                         f"{params.mechanism} samples no users")
    if params.budget is None:
        raise ValueError("the planner splits a target epsilon into q_user and rounds: give --target-epsilon")
    ranked = params.model_copy(update={"accountant": rank_accountant}) if rank_accountant else params

    def plan_at(q_user: float, rounds: int) -> tuple[float, NoiseToSignal]:
        planned = plan(ranked.model_copy(update={"q_user": q_user, "rounds": rounds}), population)
        return planned.noise_multiplier, planned.noise_to_signal

    budget = budget or budget_of(params.rounds, params.q_user, population.value)
    choice = choose_sampling(plan_at, population.value, budget, min_rounds=min_rounds)
    return params.model_copy(update={"q_user": choice.q_user, "rounds": choice.rounds}), choice
