"""``userdp``: user-level DP by DP-FedAvg (McMahan et al. 2018), as PRIVACY.md specifies.

Per round: Poisson-sample users with probability ``q_user``; each sampled user starts from the global
weights, takes ``local_steps`` SGD steps on its own sentences and returns its model delta; the delta
(not the gradients) is clipped to ``clip`` in L2 over all trainable parameters, weighted by
``w_u = min(n_u / weight_cap, 1)`` and summed; Gaussian noise with standard deviation
``sigma = z * clip * 1`` is added once to the sum; the server divides by the fixed ``q_user * W``
(``W`` = total weight) and applies the server learning rate (post-processing).

Sensitivity: adding or removing one user moves the weighted sum by at most ``max(w) * clip``; the
weight ceiling 1 is used as ``max(w)``, not the largest weight in this dataset, because the added user
may be the one that reaches it. Accounting: ``rounds``-fold ``PoissonSampled(q_user, Gaussian(z))``.

Speed: one preallocated worker model is reused for every user (its parameters are overwritten with
the global ones), instead of a deep copy per user as the UeDP reference code does.
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass
from typing import Iterator

import torch

from models.batching import batches
from models.training import optimizer_step
from privacy.accounting import AccountantKind, RoundAccountant, calibrate_noise_multiplier, check_delta, poisson_gaussian_round
from privacy.mechanisms.base import LossFn, OnRound, PrivacyStatement, RoundReport, TrainData
from privacy.primitives import assign_flat_, clip_l2, flatten, gaussian_noise, make_generator, poisson_sample


@dataclass
class UserDpParams:
    rounds: int = 30
    q_user: float = 0.5
    noise_multiplier: float | None = 1.0
    target_epsilon: float | None = None  # when set, the noise multiplier is calibrated to it
    clip: float = 1.0
    local_steps: int = 5
    local_batch_size: int = 8
    local_lr: float = 0.5
    server_lr: float = 1.0
    weight_cap: float = 1.0
    delta: float = 1e-5
    accountant: AccountantKind = "pld"
    max_epsilon: float | None = None  # budget: stop before a round would exceed it
    seed: int = 0
    secure_noise: bool = False

    def resolve_noise_multiplier(self) -> float:
        """The z this run uses: given, or the smallest one meeting ``target_epsilon`` after ``rounds``."""
        if self.target_epsilon is not None:
            return calibrate_noise_multiplier(
                lambda z: poisson_gaussian_round(self.q_user, z), self.rounds, self.target_epsilon, self.delta,
                self.accountant,
            )
        if self.noise_multiplier is None or self.noise_multiplier <= 0:
            raise ValueError("userdp needs a positive noise multiplier or a target epsilon")
        return self.noise_multiplier


def user_weights(data: TrainData, weight_cap: float) -> torch.Tensor:
    """``w_u = min(n_u / cap, 1)`` in the order of ``data.by_user``."""
    return torch.tensor([min(len(seqs) / weight_cap, 1.0) for seqs in data.by_user.values()], dtype=torch.float64)


class UserDp:
    name = "userdp"
    unit = "one user (all of their sentences)"
    WEIGHT_CEILING = 1.0

    def __init__(self, params: UserDpParams):
        self.params = params
        self.noise_multiplier = params.resolve_noise_multiplier()

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound) -> PrivacyStatement:
        p, z = self.params, self.noise_multiplier
        check_delta(p.delta, data.n_users)
        accountant = RoundAccountant(poisson_gaussian_round(p.q_user, z), p.delta, p.accountant)
        noise_gen = make_generator(p.seed, p.secure_noise, device)
        sample_gen = make_generator(p.seed + 1, p.secure_noise)
        data_gen = torch.Generator().manual_seed(p.seed + 2)

        weights = user_weights(data, p.weight_cap)
        denominator = p.q_user * float(weights.sum())
        sigma = z * p.clip * self.WEIGHT_CEILING
        params = [q for q in model.parameters() if q.requires_grad]
        worker = copy.deepcopy(model).to(device)
        user_sequences = list(data.by_user.values())
        model.train()
        worker.train()
        stopped = ""
        for round_index in range(1, p.rounds + 1):
            if p.max_epsilon is not None and accountant.peek() > p.max_epsilon:
                stopped = f"stopped before round {round_index}: epsilon would exceed the budget {p.max_epsilon:g}"
                break
            sampled = poisson_sample(len(user_sequences), p.q_user, sample_gen)
            theta = flatten(params)
            total = self.clipped_sum(worker, theta, [user_sequences[i] for i in sampled], weights[sampled].tolist(),
                                     loss_fn, device, data.pad_id, data_gen)
            noisy = total + gaussian_noise(theta.shape, sigma, noise_gen, theta.dtype)
            assign_flat_(params, theta + p.server_lr * noisy / denominator)
            epsilon = accountant.step()
            # The local losses are a function of private data the guarantee does not cover: not released.
            on_round(RoundReport(round_index, math.nan, epsilon, p.delta, len(sampled)))
        return PrivacyStatement(
            mechanism=self.name, unit=self.unit, epsilon=accountant.epsilon, delta=p.delta, accountant=p.accountant,
            noise_multiplier=z, sampling_probability=p.q_user, rounds=accountant.rounds, notes=stopped,
            extra={"noise_std": sigma, "sensitivity": p.clip * self.WEIGHT_CEILING},
        )

    def clipped_sum(self, worker: torch.nn.Module, theta: torch.Tensor, users: list[list[torch.Tensor]],
                    weights: list[float], loss_fn: LossFn, device: torch.device, pad_id: int,
                    generator: torch.Generator) -> torch.Tensor:
        """``sum_u w_u clip(Delta_u, clip)`` over the given users: the quantity whose sensitivity is bounded."""
        worker_params = [q for q in worker.parameters() if q.requires_grad]
        total = torch.zeros_like(theta)
        for sequences, weight in zip(users, weights):
            delta_u = self._local_update(worker_params, worker, theta, sequences, loss_fn, device, pad_id, generator)
            total += weight * clip_l2(delta_u, self.params.clip)
        return total

    def _local_update(self, worker_params: list[torch.Tensor], worker: torch.nn.Module, theta: torch.Tensor,
                      sequences: list[torch.Tensor], loss_fn: LossFn, device: torch.device, pad_id: int,
                      generator: torch.Generator) -> torch.Tensor:
        """K local SGD steps from the global weights; returns ``theta_u - theta``."""
        p = self.params
        assign_flat_(worker_params, theta)
        optimizer = torch.optim.SGD(worker_params, lr=p.local_lr)
        for batch in itertools.islice(_cycle(sequences, p.local_batch_size, pad_id, generator), p.local_steps):
            optimizer_step(worker, optimizer, batch, loss_fn, device)
        return flatten(worker_params) - theta


def _cycle(sequences: list[torch.Tensor], batch_size: int, pad_id: int,
           generator: torch.Generator) -> Iterator[dict[str, torch.Tensor]]:
    while True:
        yield from batches(sequences, batch_size, pad_id, generator)
