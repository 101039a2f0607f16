"""What every mechanism shares: the data it trains on, the report it gives after each round, and
its privacy statement (unit, sampling, noise, accountant), so callers can log and check them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from uedp.models.batching import Example
from uedp.models.training import LossFn  # loss_fn(model, batch) -> mean loss; mechanisms stay model-agnostic
from uedp.privacy.mechanisms.checkpoint import NO_CHECKPOINT, Checkpointer
from uedp.privacy.signal import NoiseToSignal
from uedp.privacy.statement import PrivacyStatement

__all__ = ["NO_CHECKPOINT", "Checkpointer", "HostUnits", "LossFn", "Mechanism", "OnRound", "RoundReport", "SamplesUnits",
           "TrainData", "Trained"]


@dataclass
class TrainData:
    """Training examples (token ids, or (ids, class) pairs) grouped by privacy-relevant user;
    ``pad_id`` pads batches."""

    by_user: dict[str, list[Example]]
    pad_id: int
    # For entity-level mechanisms: per user, per sequence, the keys of the detected entities of the chosen
    # categories (an empty set marks a sentence with none: one extended entity of the set S).
    entities: dict[str, list[frozenset[str]]] | None = None
    # For selective: the same users' sequences with the sensitive spans redacted.
    redacted: dict[str, list[Example]] | None = None
    # For recurrent selective: per sequence, a bool per token, True inside a sensitive span.
    private_masks: dict[str, list[torch.Tensor]] | None = None
    # The longest sequence the model takes (the configuration's max_len; 0: not known): user-level mechanisms
    # that pack a user's sentences into chunks (user_text=chunks) pack up to it.
    max_len: int = 0

    @property
    def sequences(self) -> list[Example]:
        return [seq for seqs in self.by_user.values() for seq in seqs]

    @property
    def sequence_ids(self) -> list[str]:
        """A stable identifier per sequence, parallel to :attr:`sequences`: its user and its place among
        the user's sequences. Per-unit random streams are keyed by it, so adding a sequence changes no
        other sequence's sampling coin."""
        return [f"{user}#{index}" for user, seqs in self.by_user.items() for index in range(len(seqs))]

    @property
    def n_users(self) -> int:
        return len(self.by_user)


@dataclass(frozen=True)
class RoundReport:
    round: int  # 1-based
    loss: float  # NaN for private mechanisms: a function of private data the guarantee does not cover
    # The exact epsilon after this round when the run's schedule shows it (privacy.accounting.rounds.EpsilonSchedule:
    # every round of a short run, a bounded number of a longer one, fewer when a budget stops it, always the
    # last); None between shown rounds, where no figure is computed. inf for a mechanism without a guarantee.
    epsilon: float | None
    delta: float
    # Examples this step used; None for private mechanisms: how many units were sampled depends on the
    # private data (the participants series alone would raise epsilon) and is not handed out.
    participants: int | None = None


OnRound = Callable[[RoundReport], None]


class Mechanism(Protocol):
    """What a built mechanism does: train a model in place and say what its epsilon means. What a
    mechanism *is* (unit, parameters, what data it needs, how it is planned) is its registry entry."""

    name: str
    unit: str

    def planned_epsilon(self) -> float:
        """The epsilon the run will state if it runs its planned rounds (or up to its budget stop), from a
        fresh accountant before round 1 (inf without a guarantee). Read only through the training plan
        (:mod:`services.training_plan`), which the privacy ledger, ``uedp epsilon`` and training share."""
        ...

    def noise_to_signal(self, units: float) -> NoiseToSignal | None:
        """The averaged update's noise beside its signal for ``units`` units (a public or DP count); None
        for a mechanism that adds no noise to an averaged update."""
        ...

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT) -> Trained:
        """Train ``model`` in place, call ``on_round`` after every round, return the final statement (and,
        for a mechanism that Poisson-samples units, how its rounds sampled them). Everything a caller
        needs after training is in what this returns: nothing is left on the mechanism.

        With a ``checkpoint``, resume from its saved state (rounds, weights, generators, accountant)
        when there is one, and save every ``checkpoint.every`` rounds.
        """
        ...


@dataclass(frozen=True)
class HostUnits:
    """The units through which one audit canary's text reaches training, as the mechanisms' samplers
    name them: its host users, its sentences (by :attr:`TrainData.sequence_ids`) and its entity keys."""

    users: tuple[str, ...] = ()
    sequences: tuple[str, ...] = ()
    entities: tuple[str, ...] = ()


@runtime_checkable
class SamplesUnits(Protocol):
    """A mechanism whose rounds Poisson-sample units with per-unit coins (:mod:`privacy.randomness`)."""

    def rounds_with(self, units: HostUnits, rounds: range) -> int:
        """In how many of ``rounds`` the sampling would take ``units`` in (for a canary). Each unit's coin
        is a function of the run's root, the round and the unit's name only, so the count is the same
        whether or not the canary was planted: recording it reveals no secret coin."""
        ...


@dataclass(frozen=True)
class Trained:
    """What a mechanism's training returns: its privacy statement, and for a mechanism whose rounds
    Poisson-sample units, the sampler the audit's participation record asks (it may depend on what
    training chose, e.g. uedp-bounded's kept holders, so it comes from the training, not the mechanism)."""

    statement: PrivacyStatement
    sampling: SamplesUnits | None = None
