"""``noiseless``: ordinary training, the utility ceiling every private mechanism is compared against.
Its epsilon is infinite: it promises nothing. ``deid`` and the local-DP mechanisms train this way too
(on redacted or sanitized text)."""

from __future__ import annotations

import math

import torch

from uedp.models.batching import ShuffledBatches
from uedp.models.parallel import Ranks
from uedp.models.training import adam, data_parallel_step, like_length_step
from uedp.privacy.mechanisms.base import (
    NO_CHECKPOINT,
    Checkpointer,
    LossFn,
    OnRound,
    TrainData,
    Trained,
)
from uedp.privacy.mechanisms.loop import NoAccountant, RoundLoop, RoundOutput
from uedp.privacy.mechanisms.params import NoiselessParams
from uedp.privacy.randomness import Randomness, RoundRandomness
from uedp.privacy.statement import PrivacyStatement

__all__ = ["Noiseless", "NoiselessParams"]


class Noiseless:
    name = "noiseless"
    unit = NoiselessParams.unit_words

    def __init__(self, params: NoiselessParams, seed: int = 0):
        self.params = params
        self.seed = seed  # batch order: nothing to keep secret without a guarantee
        self.name = params.mechanism

    def planned_epsilon(self) -> float:
        """No guarantee: what a noiseless (or deid, or local-DP-trained) run states is infinite."""
        return math.inf

    def noise_to_signal(self, units: float) -> None:
        """No noise: nothing drowns the update."""
        return None

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT, scope: str = "noiseless") -> Trained:
        p = self.params
        optimizer = adam([q for q in model.parameters() if q.requires_grad], p.lr, decoupled=True)
        sequences = data.sequences
        sampler = ShuffledBatches(len(sequences), p.batch_size, torch.Generator().manual_seed(self.seed))
        ranks = Ranks.current()  # under torchrun, each process takes a share of every batch

        def one_step(step: int, _: RoundRandomness) -> RoundOutput:
            batch = [sequences[i] for i in sampler.next()]
            if ranks.world > 1:
                loss = data_parallel_step(model, optimizer, batch, data.pad_id, loss_fn, device, ranks)
            else:
                loss = like_length_step(model, optimizer, batch, data.pad_id, loss_fn, device)
            return RoundOutput(loss, len(batch))

        loop = RoundLoop(scope, p.steps, NoAccountant(), Randomness.seeded(self.seed), word="step",
                         state={"model": model, "optimizer": optimizer, "sampler": sampler},
                         shared_draws_allowed=True)  # no guarantee: dropout draws as in any training
        model.train()
        outcome = loop.run(one_step, on_round, checkpoint)
        return Trained(PrivacyStatement(mechanism=self.name, unit=self.unit, rounds=outcome.rounds, notes=outcome.stopped))
