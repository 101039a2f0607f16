"""``noiseless``: ordinary training, the utility ceiling every private mechanism is compared against.
Its epsilon is infinite: it promises nothing."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from models.batching import batches
from models.training import optimizer_step
from privacy.mechanisms.base import LossFn, OnRound, PrivacyStatement, RoundReport, TrainData


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
              on_round: OnRound) -> PrivacyStatement:
        p = self.params
        optimizer = torch.optim.AdamW(model.parameters(), lr=p.lr, weight_decay=0.0)
        generator = torch.Generator().manual_seed(p.seed)
        sequences = data.sequences
        model.train()
        step = 0
        while step < p.steps:
            for batch in batches(sequences, p.batch_size, data.pad_id, generator):
                loss = optimizer_step(model, optimizer, batch, loss_fn, device)
                step += 1
                on_round(RoundReport(step, loss, math.inf, 0.0, len(batch["input_ids"])))
                if step >= p.steps:
                    break
        return PrivacyStatement(mechanism=self.name, unit=self.unit, rounds=step)
