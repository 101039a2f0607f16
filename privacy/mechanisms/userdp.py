"""``userdp``: user-level DP by DP-FedAvg (McMahan et al. 2018), as PRIVACY.md specifies.

Per round: Poisson-sample users with probability ``q_user`` (each user by its own coin); each sampled
user starts from the global weights, takes ``local_steps`` SGD steps on its own sentences (batches in
the order of its own stream) and returns its model delta; the delta (not the gradients) is clipped to
``clip`` in L2 over all trainable parameters, weighted by ``w_u = min(n_u / weight_cap, 1)`` (the user's
own data only) and summed; Gaussian noise with standard deviation ``sigma = z * clip * 1`` is added
once to the sum; the server divides by the fixed ``q_user * N`` and applies the server learning rate
(post-processing). N is a public or DP count of users (:mod:`privacy.population`), never the exact one.

Sensitivity: adding or removing one user moves the weighted sum by at most ``max(w) * clip``; the
weight ceiling 1 is used as ``max(w)``, not the largest weight in this dataset, because the added user
may be the one that reaches it. Accounting: the DP count (if any), then ``rounds``-fold
``PoissonSampled(q_user, Gaussian(z))``.

Randomness: sampling, noise and every user's batch order come from the run's
:class:`privacy.randomness.Randomness` (secret OS randomness unless the run is seeded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from uedp.privacy.accounting import AccountantKind, RoundAccountant, check_delta, poisson_gaussian_round, resolve_noise_multiplier
from uedp.privacy.mechanisms.base import NO_CHECKPOINT, Checkpointer, LossFn, OnRound, PrivacyStatement, RoundReport, TrainData
from uedp.privacy.mechanisms.fedavg import WEIGHT_CEILING, LocalTrainer, user_weights
from uedp.privacy.mechanisms.vectorized import VectorizedLocalTrainer
from uedp.privacy.population import Population
from uedp.privacy.primitives import assign_flat_, flatten, gaussian_noise
from uedp.privacy.randomness import Randomness


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
    vectorize_users: bool = False  # local updates of a round's users at once (torch.func.vmap)


class UserDp:
    name = "userdp"
    unit = "one user (all of their sentences)"

    def __init__(self, params: UserDpParams, population: Population, randomness: Randomness | None = None):
        self.params = params
        self.population = population
        self.randomness = randomness or Randomness.secure()
        self.noise_multiplier = resolve_noise_multiplier(
            self.name, params.noise_multiplier, params.target_epsilon, lambda z: poisson_gaussian_round(params.q_user, z),
            params.rounds, params.delta, params.accountant, initial=population.event())

    @property
    def denominator(self) -> float:
        """``q_user * N``: the expected number of sampled users, fixed before training."""
        return self.params.q_user * self.population.value

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT) -> PrivacyStatement:
        p, z, rng = self.params, self.noise_multiplier, self.randomness
        check_delta(p.delta, round(self.population.value))
        accountant = RoundAccountant(poisson_gaussian_round(p.q_user, z), p.delta, p.accountant,
                                     initial=self.population.event())
        trainer = self.local_trainer(model, loss_fn, device, data.pad_id)
        weights = user_weights(data, p.weight_cap)
        sigma = z * p.clip * WEIGHT_CEILING
        params = [q for q in model.parameters() if q.requires_grad]
        user_ids = list(data.by_user)
        user_sequences = list(data.by_user.values())
        # No generator is saved: every round's randomness is derived from (root, round), and a resumed
        # secure run continues with a fresh root.
        state = {"model": model, "accountant": accountant}
        done = (checkpoint.restore(self.name, state) or {"round": 0})["round"]
        model.train()
        stopped = ""
        for round_index in range(done + 1, p.rounds + 1):
            if p.max_epsilon is not None and accountant.peek() > p.max_epsilon:
                stopped = f"stopped before round {round_index}: epsilon would exceed the budget {p.max_epsilon:g}"
                break
            sampled = rng.poisson_sample("sample-users", round_index, user_ids, p.q_user)
            streams = [rng.stream("local-batches", round_index, user_ids[i]) for i in sampled]
            theta = flatten(params)
            total = trainer.clipped_sum(theta, [user_sequences[i] for i in sampled], weights[sampled].tolist(), streams)
            noise = gaussian_noise(theta.shape, sigma, rng.stream("noise", round_index), theta.dtype, theta.device)
            assign_flat_(params, theta + p.server_lr * (total + noise) / self.denominator)
            epsilon = accountant.step()
            # Neither the local losses nor the number of sampled users is released.
            on_round(RoundReport(round_index, math.nan, epsilon, p.delta))
            checkpoint.maybe_save(self.name, round_index, state)
        return PrivacyStatement(
            mechanism=self.name, unit=self.unit, epsilon=accountant.epsilon, delta=p.delta, accountant=p.accountant,
            noise_multiplier=z, sampling_probability=p.q_user, rounds=accountant.rounds, notes=stopped,
            extra={"noise_std": sigma, "sensitivity": p.clip * WEIGHT_CEILING, "population_used": self.population.value,
                   "denominator": self.denominator},
            randomness=rng.mode, public=(self.population.describe(),), caveats=rng.caveats,
        )

    def local_trainer(self, model: torch.nn.Module, loss_fn: LossFn, device: torch.device, pad_id: int) -> LocalTrainer:
        return make_local_trainer(self.params, model, loss_fn, device, pad_id)


def make_local_trainer(p: UserDpParams, model: torch.nn.Module, loss_fn: LossFn, device: torch.device,
                       pad_id: int) -> LocalTrainer:
    """The local-update engine of userdp and uedp: sequential or vectorized over users (same results)."""
    cls = VectorizedLocalTrainer if p.vectorize_users else LocalTrainer
    return cls(model, loss_fn, device, pad_id, p.clip, p.local_steps, p.local_batch_size, p.local_lr)
