"""The one round loop every trained mechanism runs (nanoGPT's single readable loop, for DP).

The loop owns what must be done the same way everywhere, so a defect here is fixed once:

* **randomness**: round ``r`` sees only :class:`RoundRandomness` keyed by ``r`` (secret OS randomness
  unless the run is seeded); nothing stateful is kept or checkpointed;
* **checkpoints**: the state a mechanism names (weights, optimizer) and its ledger are restored before
  the first round and saved every ``checkpoint.every`` rounds;
* **no shared draws**: a private round during which a layer drew from torch's global generator (which
  all units share) is refused (:mod:`privacy.layer_randomness`); only a loop without a guarantee
  (``shared_draws_allowed``) lets layers draw there;
* **the budget stop**: before a round, the ledger says (exactly) whether epsilon after it would exceed
  ``max_epsilon``; such a round does not run (nothing is released for it);
* **reports**: after each round, epsilon (exact, or a close upper bound: see ``RoundAccountant``) and (for mechanisms without a guarantee only) loss and batch
  size go to ``on_round``.

A mechanism supplies only what differs: the round body (who is sampled, each unit's contribution, the
noise) and its ledger (the round's ``DpEvent``, composed by dp_accounting).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from uedp.privacy.accounting import RoundAccountant
from uedp.privacy.layer_randomness import DROPOUT_NOTE, no_global_draws
from uedp.privacy.mechanisms.base import OnRound, PrivacyStatement, RoundReport
from uedp.privacy.mechanisms.checkpoint import Checkpointer, Restorable
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness, RoundRandomness


class Ledger(Protocol):
    """What the loop needs of an accountant: epsilon now, whether one more round would exceed a budget,
    the epsilon to report for a round it spends, and a checkpointable state."""

    @property
    def epsilon(self) -> float: ...

    @property
    def rounds(self) -> int: ...

    def would_exceed(self, budget: float) -> bool: ...

    def step(self) -> float: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class NoLedger:
    """The ledger of a mechanism without a guarantee: epsilon is infinite from the start."""

    rounds: int = 0
    epsilon: float = math.inf

    def would_exceed(self, budget: float) -> bool:
        return True

    def step(self) -> float:
        self.rounds += 1
        return math.inf

    def state_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds = int(state["rounds"])


@dataclass
class WorstCaseLedger:
    """Several accountants for one run whose epsilon is the largest of them (uedp: the case where the
    changed entity is detected, and the case where it is an extended entity)."""

    cases: dict[str, RoundAccountant]

    @property
    def epsilon(self) -> float:
        return max(a.epsilon for a in self.cases.values())

    @property
    def rounds(self) -> int:
        return min(a.rounds for a in self.cases.values())

    def would_exceed(self, budget: float) -> bool:
        return any(a.would_exceed(budget) for a in self.cases.values())

    def step(self) -> float:
        return max(a.step() for a in self.cases.values())

    def state_dict(self) -> dict[str, Any]:
        return {case: a.state_dict() for case, a in self.cases.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for case, accountant in self.cases.items():
            accountant.load_state_dict(state[case])


@dataclass(frozen=True)
class RoundOutput:
    """What one round hands back for its report. Private mechanisms leave both unset: the loss and the
    number of sampled units are functions of private data the guarantee does not cover."""

    loss: float = math.nan
    participants: int | None = None


RoundBody = Callable[[int, RoundRandomness], RoundOutput]


@dataclass(frozen=True)
class LoopOutcome:
    rounds: int  # rounds done in all, counting rounds restored from a checkpoint
    stopped: str = ""  # why the loop ended early, or ""


@dataclass
class RoundLoop:
    """``rounds`` rounds of ``body`` under one scope of the checkpoint (one per training phase)."""

    scope: str
    rounds: int
    ledger: Ledger
    randomness: Randomness
    delta: float = 0.0
    max_epsilon: float | None = None
    word: str = "round"  # "step" for DP-SGD, in the budget-stop note
    state: dict[str, Restorable] = field(default_factory=dict)
    # Only loops without a guarantee (noiseless training) let layers draw from torch's global generator.
    shared_draws_allowed: bool = False

    def run(self, body: RoundBody, on_round: OnRound, checkpoint: Checkpointer) -> LoopOutcome:
        objects: dict[str, Restorable] = {**self.state, "ledger": self.ledger}
        done = int((checkpoint.restore(self.scope, objects) or {"round": 0})["round"])
        last, stopped = done, ""
        for round_index in range(done + 1, self.rounds + 1):
            if self.max_epsilon is not None and self.ledger.would_exceed(self.max_epsilon):
                stopped = (f"stopped before {self.word} {round_index}: epsilon would exceed the budget "
                           f"{self.max_epsilon:g}")
                break
            with (contextlib.nullcontext() if self.shared_draws_allowed else no_global_draws(self.scope, round_index)):
                output = body(round_index, RoundRandomness(self.randomness, round_index))
            epsilon = self.ledger.step()
            on_round(RoundReport(round_index, output.loss, epsilon, self.delta, output.participants))
            checkpoint.maybe_save(self.scope, round_index, objects)
            last = round_index
        return LoopOutcome(last, stopped)


def private_statement(mechanism: str, unit: str, ledger: Ledger, outcome: LoopOutcome, *, delta: float,
                      accountant: str, noise_multiplier: float, sampling_probability: float,
                      randomness: Randomness, population: Population | None, extra: dict[str, float],
                      caveats: tuple[str, ...] = (), dropout_switched_off: int = 0,
                      notes: tuple[str, ...] = ()) -> PrivacyStatement:
    """The statement of a loop that ran under a guarantee: epsilon for the rounds run, with what it
    treats as public (the unit count), what it does not cover (seeded randomness, the mechanism's own,
    other runs that count the same units) and what the run changed to keep it (dropout switched off)."""
    said = (outcome.stopped, *(notes), DROPOUT_NOTE.format(count=dropout_switched_off) if dropout_switched_off else "")
    return PrivacyStatement(
        mechanism=mechanism, unit=unit, epsilon=ledger.epsilon, delta=delta, accountant=accountant,
        noise_multiplier=noise_multiplier, sampling_probability=sampling_probability, rounds=outcome.rounds,
        notes="; ".join(filter(None, said)),
        extra={**extra, **({"population_used": population.value} if population is not None else {})},
        randomness=randomness.mode, public=(population.describe(),) if population is not None else (),
        caveats=tuple(filter(None, (*randomness.caveats, *caveats,
                                    population.cross_run_caveat(mechanism) if population is not None else None))),
    )
