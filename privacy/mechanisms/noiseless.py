"""``noiseless``: ordinary training, the utility ceiling every private mechanism is compared against.
Its epsilon is infinite: it promises nothing."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from uedp.models.batching import ShuffledBatches, collate
from uedp.models.parallel import Ranks
from uedp.models.training import data_parallel_step, optimizer_step
from uedp.privacy.mechanisms.base import NO_CHECKPOINT, Checkpointer, LossFn, OnRound, PrivacyStatement, RoundReport, TrainData


@dataclass
class NoiselessParams:
    steps: int = 300
    batch_size: int = 16
    lr: float = 1e-3
    seed: int = 0


class Noiseless:
    name = "noiseless"
    unit = "none"

    def __init__(self, params: NoiselessParams):
        self.params = params

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT, scope: str = "noiseless") -> PrivacyStatement:
        p = self.params
        optimizer = torch.optim.AdamW(model.parameters(), lr=p.lr, weight_decay=0.0)
        sequences = data.sequences
        sampler = ShuffledBatches(len(sequences), p.batch_size, torch.Generator().manual_seed(p.seed))
        state = {"model": model, "optimizer": optimizer, "sampler": sampler}
        done = (checkpoint.restore(scope, state) or {"round": 0})["round"]
        model.train()
        ranks = Ranks.current()  # under torchrun, each process takes a share of every batch
        for step in range(done + 1, p.steps + 1):
            batch = [sequences[i] for i in sampler.next()]
            if ranks.world > 1:
                loss = data_parallel_step(model, optimizer, batch, data.pad_id, loss_fn, device, ranks)
            else:
                loss = optimizer_step(model, optimizer, collate(batch, data.pad_id), loss_fn, device)
            on_round(RoundReport(step, loss, math.inf, 0.0, len(batch)))
            checkpoint.maybe_save(scope, step, state)
        return PrivacyStatement(mechanism=self.name, unit=self.unit, rounds=max(p.steps, done))
