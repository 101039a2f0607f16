"""The one round loop every trained mechanism runs (nanoGPT's single readable loop, for DP).

The loop owns what must be done the same way everywhere, so a defect here is fixed once:

* **randomness**: round ``r`` sees only :class:`RoundRandomness` keyed by ``r`` (secret OS randomness
  unless the run is seeded); nothing stateful is kept or checkpointed;
* **checkpoints**: the state a mechanism names (weights, optimizer) and its accountant are restored before
  the first round and saved every ``checkpoint.every`` rounds;
* **no shared draws**: a private round during which a layer drew from torch's global generator (which
  all units share) is refused (:mod:`privacy.layer_randomness`); only a loop without a guarantee
  (``shared_draws_allowed``) lets layers draw there;
* **accounting off the hot path**: before the first round the run's accountant plans the run
  (:class:`~uedp.privacy.accounting.rounds.EpsilonSchedule`): the last round a ``max_epsilon`` budget allows
  (exactly: epsilon after it is within the budget, after the next it would not be) and the exact
  epsilon of the rounds it shows. Rounds past the stop do not run (nothing is released for them);
  inside the loop the accountant only counts rounds;
* **reports**: after each round, the exact epsilon when the schedule shows that round (None between
  shown rounds) and, for mechanisms without a guarantee only, loss and batch size go to ``on_round``;
* **divergence**: a run whose weights, update or (non-private) loss stop being finite or grow far past
  their start is stopped (:mod:`privacy.mechanisms.divergence`); its statement says after which round, and
  states the planned run's epsilon (the stopping round is read from released figures, so the epsilon of
  the rounds run would not be a guarantee).

A mechanism supplies only what differs: the round body (who is sampled, each unit's contribution, the
noise) and its accountant (the round's ``DpEvent``, composed by dp_accounting).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from uedp.privacy.accounting.rounds import EpsilonSchedule, RoundAccountant, planned_final, schedule_epsilons
from uedp.privacy.layer_randomness import DROPOUT_NOTE, no_global_draws
from uedp.privacy.mechanisms.base import OnRound, RoundReport
from uedp.privacy.mechanisms.checkpoint import Checkpointer, Restorable
from uedp.privacy.mechanisms.divergence import DivergenceWatch, weight_norm
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness, RoundRandomness
from uedp.privacy.statement import PrivacyStatement

DIVERGED = "the run diverged"  # in a divergence stop's note (selective reads its noiseless phase's)


class RunAccountant(Protocol):
    """What the loop needs of an accountant. All accounting is done by ``plan``, before the first round;
    during training the loop only counts rounds with ``spend``, so no privacy loss distribution is
    composed between steps."""

    @property
    def epsilon(self) -> float:
        """Exact epsilon after the rounds spent: what the statement reports."""
        ...

    @property
    def rounds(self) -> int: ...

    def schedule_for(self, rounds: int, budget: float | None) -> EpsilonSchedule:
        """The schedule of a run of ``rounds`` rounds under ``budget`` (None: no budget)."""
        ...

    def final(self, rounds: int, budget: float | None) -> float:
        """The last figure of :meth:`schedule_for`'s schedule (what the run states), planned no further than needed."""
        ...

    def spend(self) -> float | None:
        """One round ran: its exact epsilon when the schedule shows it, else None."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class NoAccountant:
    """The accountant of a mechanism without a guarantee: epsilon is infinite from the start, so a budget
    (if one were given) stops it before its first round."""

    rounds: int = 0
    epsilon: float = math.inf

    def schedule_for(self, rounds: int, budget: float | None) -> EpsilonSchedule:
        return EpsilonSchedule(rounds, rounds if budget is None else 0)

    def final(self, rounds: int, budget: float | None) -> float:
        return self.epsilon

    def spend(self) -> float:
        self.rounds += 1
        return math.inf

    def state_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds = int(state["rounds"])


@dataclass
class WorstCaseAccountant:
    """Several accountants for one run whose epsilon is the largest of them (uedp: the case where the
    changed entity is detected, and the case where it is an extended entity). Planned together: the run
    stops at the first round at which any case would exceed the budget, and shows the largest figure."""

    cases: dict[str, RoundAccountant]

    @property
    def epsilon(self) -> float:
        return max(a.epsilon for a in self.cases.values())

    @property
    def rounds(self) -> int:
        return min(a.rounds for a in self.cases.values())

    def schedule_for(self, rounds: int, budget: float | None) -> EpsilonSchedule:
        return schedule_epsilons(list(self.cases.values()), rounds, budget)

    def final(self, rounds: int, budget: float | None) -> float:
        return planned_final(list(self.cases.values()), rounds, budget)

    def spend(self) -> float | None:
        figures = [a.spend() for a in self.cases.values()]  # the cases show the same rounds
        shown = [f for f in figures if f is not None]
        return max(shown) if len(shown) == len(figures) else None

    def state_dict(self) -> dict[str, Any]:
        return {case: a.state_dict() for case, a in self.cases.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for case, accountant in self.cases.items():
            accountant.load_state_dict(state[case])


@dataclass(frozen=True)
class RoundOutput:
    """What one round hands back for its report. Private mechanisms leave the loss and the number of
    sampled units unset: both are functions of private data the guarantee does not cover. They may give
    ``update_norm``, the norm of the noised update the round applied (post-processing of what the
    accounting treats as released), which the divergence watch reads."""

    loss: float | None = None
    participants: int | None = None
    update_norm: float | None = None


RoundBody = Callable[[int, RoundRandomness], RoundOutput]


@dataclass(frozen=True)
class LoopOutcome:
    rounds: int  # rounds done in all, counting rounds restored from a checkpoint
    stopped: str = ""  # why the loop ended early, or ""
    # The epsilon the statement must report when it is not the accountant's for the rounds run: a run stopped
    # for divergence at a round chosen from what it released reports the planned run's (below).
    epsilon: float | None = None


@dataclass
class RoundLoop:
    """``rounds`` rounds of ``body`` under one scope of the checkpoint (one per training phase)."""

    scope: str
    rounds: int
    accountant: RunAccountant
    randomness: Randomness
    delta: float = 0.0
    max_epsilon: float | None = None
    word: str = "round"  # "step" for DP-SGD, in the budget-stop note
    state: dict[str, Restorable] = field(default_factory=dict)
    # Only loops without a guarantee (noiseless training) let layers draw from torch's global generator.
    shared_draws_allowed: bool = False

    def run(self, body: RoundBody, on_round: OnRound, checkpoint: Checkpointer) -> LoopOutcome:
        # "ledger": the accountant's name in checkpoints written before it was renamed (they still resume)
        objects: dict[str, Restorable] = {**self.state, "ledger": self.accountant}
        restored = checkpoint.restore(self.scope, objects) or {"round": 0}
        done = int(restored["round"])
        watch = DivergenceWatch(self.word)
        if restored.get("divergence"):
            watch.load_state_dict(restored["divergence"])
        weights = self._trainable()
        watch.start(weight_norm(weights))
        schedule = self.accountant.schedule_for(self.rounds, self.max_epsilon)  # all the accounting, before round 1
        last, diverged = done, None
        for round_index in range(done + 1, schedule.last + 1):
            with (contextlib.nullcontext() if self.shared_draws_allowed else no_global_draws(self.scope, round_index)):
                output = body(round_index, RoundRandomness(self.randomness, round_index))
            epsilon = self.accountant.spend()
            loss = math.nan if output.loss is None else output.loss
            on_round(RoundReport(round_index, loss, epsilon, self.delta, output.participants))
            last = round_index
            diverged = watch.check(round_index, weights=weight_norm(weights), loss=output.loss,
                                   update=output.update_norm)
            if diverged:
                break
            checkpoint.maybe_save(self.scope, round_index, objects, divergence=watch.state_dict())
        if diverged:
            return self._diverged(last, schedule, diverged)
        stopped = ""
        if schedule.stopped_by_budget:
            stopped = (f"stopped before {self.word} {max(schedule.last, done) + 1}: epsilon would exceed the budget "
                       f"{self.max_epsilon:g}")
        return LoopOutcome(last, stopped)

    def _diverged(self, last: int, schedule: EpsilonSchedule, why: str) -> LoopOutcome:
        """The outcome of a divergence stop. The round it stopped at was chosen by reading the released
        iterates, so the epsilon of the rounds run is not a guarantee (an epsilon chosen by the outcome
        needs an odometer's accounting); the planned run's is: stopping is post-processing of its transcript."""
        said = f"stopped after {self.word} {last} of {schedule.last}: {DIVERGED} ({why})"
        if isinstance(self.accountant, NoAccountant):
            return LoopOutcome(last, said)
        planned = schedule.shown.get(schedule.last)
        said += (f"; the epsilon stated is the planned {schedule.last} {self.word}s' (a stop decided from released "
                 "figures does not lower it), and the model is the one after the last round run; `uedp epsilon` "
                 "shows a configuration's noise-to-signal before it trains")
        return LoopOutcome(last, said, planned)

    def _trainable(self) -> list[Any]:
        """The weights the rounds change (of the state's ``model``), for the divergence watch."""
        model = self.state.get("model")
        parameters = getattr(model, "parameters", None)
        return [p for p in parameters() if p.requires_grad] if callable(parameters) else []


def planned_epsilon(accountant: RunAccountant, rounds: int, budget: float | None) -> float:
    """The epsilon a run of ``rounds`` rounds under ``budget`` will state if it is not interrupted: its
    schedule's figure at the last round that runs (what a divergence stop states too). Planned on a
    fresh accountant, before any data is touched: the privacy ledger reserves it (services.privacy_budget)."""
    return accountant.final(rounds, budget)


def private_statement(mechanism: str, unit: str, run_accountant: RunAccountant, outcome: LoopOutcome, *, delta: float,
                      accountant: str, noise_multiplier: float, sampling_probability: float,
                      randomness: Randomness, population: Population | None, extra: dict[str, float],
                      caveats: tuple[str, ...] = (), dropout_switched_off: int = 0,
                      notes: tuple[str, ...] = ()) -> PrivacyStatement:
    """The statement of a loop that ran under a guarantee: epsilon for the rounds run, with what it
    treats as public (the unit count), what it does not cover (seeded randomness, the mechanism's own,
    other runs that count the same units) and what the run changed to keep it (dropout switched off)."""
    said = (outcome.stopped, *(notes), DROPOUT_NOTE.format(count=dropout_switched_off) if dropout_switched_off else "")
    return PrivacyStatement(
        mechanism=mechanism, unit=unit, epsilon=run_accountant.epsilon if outcome.epsilon is None else outcome.epsilon,
        delta=delta, accountant=accountant,
        noise_multiplier=noise_multiplier, sampling_probability=sampling_probability, rounds=outcome.rounds,
        notes="; ".join(filter(None, said)),
        extra={**extra, **({"population_used": population.value} if population is not None else {})},
        randomness=randomness.mode, public=(population.describe(),) if population is not None else (),
        caveats=tuple(filter(None, (*randomness.caveats, *caveats,
                                    population.cross_run_caveat(mechanism) if population is not None else None))),
    )
