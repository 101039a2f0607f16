"""``dpsgd``: example-level DP-SGD (Abadi et al. 2016); the privacy unit is one training sequence.

Per step: Poisson-sample sequences with ``q = expected_batch_size / N`` (each sequence by its own coin;
N is a public or DP count of sequences, :mod:`privacy.population`); per-example gradients come
from Opacus' ``GradSampleModule``; each example's gradient is clipped to ``clip`` in L2 over all
trainable parameters (flat clipping); Gaussian noise with standard deviation ``z * clip`` is added
once to the sum, which is divided by the fixed expected batch size, and the optimizer (Adam, or any
other: post-processing) steps. An empty Poisson batch still adds noise and counts as a step.
Accounting: the DP count of sequences (if any), then ``steps``-fold ``PoissonSampled(q, Gaussian(z))``
by dp_accounting. Sampling and noise come from the run's :class:`privacy.randomness.Randomness`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import dp_accounting

import torch
from opacus import GradSampleModule

from uedp.models.batching import collate
from uedp.models.device import autocast
from uedp.models.parallel import Ranks
from uedp.privacy.accounting import (AccountantKind, Adjacency, RoundAccountant, check_delta, poisson_gaussian_round,
                                resolve_noise_multiplier)
from uedp.privacy.mechanisms.base import NO_CHECKPOINT, Checkpointer, LossFn, OnRound, PrivacyStatement, RoundReport, TrainData
from uedp.privacy.population import Population
from uedp.privacy.primitives import gaussian_noise
from uedp.privacy.randomness import Randomness, RandomSource


@dataclass
class DpSgdParams:
    steps: int = 300
    expected_batch_size: int = 16
    noise_multiplier: float | None = 1.0
    target_epsilon: float | None = None
    clip: float = 1.0
    lr: float = 1e-3
    delta: float = 1e-5
    accountant: AccountantKind = "pld"
    max_epsilon: float | None = None
    adjacency: Adjacency = "add_remove"  # "replace" when the unit is a value inside a sequence (selective)


class DpSgd:
    """DP-SGD's loop; subclasses change what an example is, its gradient and the per-step event."""

    name = "dpsgd"
    unit = "one training sequence"
    loss_reduction = "mean"  # how the loss sums examples, for Opacus' per-sample gradient scaling

    def __init__(self, params: DpSgdParams, population: Population, randomness: Randomness | None = None):
        if population.value < 1:
            raise ValueError(f"{self.name} needs at least one training sequence")
        self.params = params
        self.population = population
        self.randomness = randomness or Randomness.secure()
        self.sample_rate = min(1.0, params.expected_batch_size / population.value)
        self.noise_multiplier = resolve_noise_multiplier(
            self.name, params.noise_multiplier, params.target_epsilon, self.round_event, params.steps, params.delta,
            params.accountant, params.adjacency, initial=population.event())

    def round_event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        """One step: the Poisson-sampled Gaussian release of the noised gradient sum."""
        return poisson_gaussian_round(self.sample_rate, noise_multiplier)

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT, scope: str | None = None) -> PrivacyStatement:
        """``loss_fn`` must be a mean of per-example losses (``models.metrics.per_sequence_lm_loss``)."""
        p, z, q, rng = self.params, self.noise_multiplier, self.sample_rate, self.randomness
        scope = scope or self.name
        examples = self.examples(model, data)
        example_ids = data.sequence_ids
        check_delta(p.delta, round(self.population.value))
        accountant = RoundAccountant(self.round_event(z), p.delta, p.accountant, p.adjacency,
                                     initial=self.population.event())
        with warnings.catch_warnings():  # Opacus warns about modules it does not validate strictly
            warnings.simplefilter("ignore")
            private = GradSampleModule(model, strict=False, loss_reduction=self.loss_reduction)
        params = [q_ for q_ in private.parameters() if q_.requires_grad]
        optimizer = torch.optim.Adam(params, lr=p.lr)
        state = {"model": model, "optimizer": optimizer, "accountant": accountant}  # no generator: derived per step
        done = (checkpoint.restore(scope, state) or {"round": 0})["round"]
        private.train()
        stopped = ""
        try:
            for step in range(done + 1, p.steps + 1):
                if p.max_epsilon is not None and accountant.peek() > p.max_epsilon:
                    stopped = f"stopped before step {step}: epsilon would exceed the budget {p.max_epsilon:g}"
                    break
                batch = [examples[i] for i in rng.poisson_sample("sample-examples", step, example_ids, q)]
                noise_gen = rng.stream("noise", step)
                gradients = self.step_gradient(private, model, params, batch, loss_fn, device, data.pad_id, noise_gen)
                for param, grad in zip(params, gradients):
                    param.grad = grad
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                on_round(RoundReport(step, math.nan, accountant.step(), p.delta))  # the batch size is not released
                checkpoint.maybe_save(scope, step, state)
        finally:
            private.remove_hooks()  # the caller gets its plain model back
        return PrivacyStatement(
            mechanism=self.name, unit=self.unit, epsilon=accountant.epsilon, delta=p.delta, accountant=p.accountant,
            noise_multiplier=z, sampling_probability=q, rounds=accountant.rounds, notes=stopped,
            extra={"noise_std": z * p.clip, "sensitivity": p.clip, "population_used": self.population.value,
                   **self.statement_extra()},
            randomness=rng.mode, public=(self.population.describe(),), caveats=(*rng.caveats, *self.statement_caveats()),
        )

    def examples(self, model: torch.nn.Module, data: TrainData) -> list[Any]:
        """What Poisson sampling draws from: the training sequences."""
        return data.sequences

    def statement_extra(self) -> dict[str, float]:
        return {}

    def statement_caveats(self) -> tuple[str, ...]:
        """What this mechanism's epsilon does not cover, beyond what every run says."""
        return ()

    def step_gradient(self, private: GradSampleModule, model: torch.nn.Module, params: list[torch.Tensor],
                      batch: list[Any], loss_fn: LossFn, device: torch.device, pad_id: int,
                      noise_gen: RandomSource) -> list[torch.Tensor]:
        return self.noisy_gradient(private, params, batch, loss_fn, device, pad_id, noise_gen)

    def noisy_gradient(self, private: GradSampleModule, params: list[torch.Tensor], batch: list[torch.Tensor],
                       loss_fn: LossFn, device: torch.device, pad_id: int,
                       noise_gen: RandomSource) -> list[torch.Tensor]:
        """``(sum_i clip(g_i) + N(0, (z clip)^2 I)) / expected_batch_size``, per parameter.

        Under torchrun each process sums its share of the batch; the shares are added before the
        noise, which every process draws alike from the same generator."""
        sigma = self.noise_multiplier * self.params.clip
        ranks = Ranks.current()
        summed = ranks.sum_(self.clipped_gradient_sum(private, params, ranks.mine(batch), loss_fn, device, pad_id))
        return [(total + gaussian_noise(total.shape, sigma, noise_gen, total.dtype, total.device)) / self.params.expected_batch_size
                for total in summed]

    def clipped_gradient_sum(self, private: GradSampleModule, params: list[torch.Tensor],
                              batch: list[torch.Tensor], loss_fn: LossFn, device: torch.device,
                              pad_id: int) -> list[torch.Tensor]:
        """``sum_i clip(g_i, clip)`` per parameter, from Opacus' per-example gradients (flat clipping)."""
        if not batch:
            return [torch.zeros_like(param) for param in params]
        inputs = {k: v.to(device) for k, v in collate(batch, pad_id).items()}
        with autocast(device):
            loss = loss_fn(private, inputs)
        with warnings.catch_warnings():  # PyTorch notes that Opacus' hooks fire on outputs only: expected
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss.backward()
        # loss_reduction="mean": Opacus scales per-sample gradients back to per-example losses.
        return sum_clipped_grad_samples(params, len(batch), self.params.clip)


def sum_clipped_grad_samples(params: list[torch.Tensor], batch_size: int, clip: float) -> list[torch.Tensor]:
    """``sum_i clip(g_i, clip)`` per parameter from Opacus' ``grad_sample`` (flat clipping over all
    parameters; a non-finite example counts 0); clears ``grad_sample`` and ``grad`` afterwards."""
    samples = [param.grad_sample if param.grad_sample is not None
               else torch.zeros((batch_size, *param.shape), device=param.device) for param in params]
    norms = torch.sqrt(sum(g.reshape(batch_size, -1).pow(2).sum(1) for g in samples))
    scale = torch.clamp(clip / (norms + 1e-12), max=1.0)
    scale = torch.where(torch.isfinite(norms), scale, torch.zeros_like(scale))
    summed = [torch.einsum("b,b...->...", scale, torch.nan_to_num(g)) for g in samples]
    for param in params:
        param.grad_sample = None
        param.grad = None
    return summed
