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

from dataclasses import dataclass, field, replace

import dp_accounting
import torch

from uedp.privacy.accounting import (
    MIN_NOISE_MULTIPLIER,
    Adjacency,
    RoundAccountant,
    check_delta,
    epsilon_after,
    poisson_gaussian_round,
    resolve_noise_multiplier,
)
from uedp.privacy.layer_randomness import dropout_switched_off
from uedp.privacy.mechanisms.base import (
    NO_CHECKPOINT,
    Checkpointer,
    HostUnits,
    LossFn,
    OnRound,
    SamplesUnits,
    TrainData,
    Trained,
)
from uedp.privacy.mechanisms.fedavg import WEIGHT_CEILING, LocalTrainer, user_weights
from uedp.privacy.mechanisms.loop import RoundLoop, RoundOutput, private_statement
from uedp.privacy.mechanisms.params import UserDpParams
from uedp.privacy.mechanisms.registry import AuditDesign, BuildContext, EpsilonPlan, MechanismSpec, RunShape, register
from uedp.privacy.mechanisms.vectorized import VectorizedLocalTrainer
from uedp.privacy.population import Population
from uedp.privacy.primitives import assign_flat_, flatten, noise_ahead
from uedp.privacy.randomness import Randomness, RoundRandomness

__all__ = ["Selection", "UserDp", "UserDpParams", "make_local_trainer"]


@dataclass(frozen=True)
class Selection:
    """What DP-FedAvg's rounds train on, chosen before the first round, with what the statement adds
    about the choice and the sampler the audit asks (uedp-bounded: the holders kept). Returned from
    :meth:`UserDp.select` and carried through training, never left on the mechanism."""

    data: TrainData
    sampling: SamplesUnits
    extra: dict[str, float] = field(default_factory=dict)
    public: tuple[str, ...] = ()


class UserDp:
    """DP-FedAvg. Subclasses change what it trains on (:meth:`select`) and the round's privacy event and
    adjacency (:meth:`round_event`)."""

    name = "userdp"
    unit = "one user (all of their sentences)"
    adjacency: Adjacency = "add_remove"
    noise_floor = MIN_NOISE_MULTIPLIER  # the least z a calibration searches (see calibrate_noise_multiplier)

    def __init__(self, params: UserDpParams, population: Population | None, randomness: Randomness | None = None):
        self.params = params
        self.population = population  # None: the number of users is public by the adjacency (read at train)
        self.randomness = randomness or Randomness.secure()
        self.noise_multiplier = resolve_noise_multiplier(
            self.name, params.noise_multiplier, params.target_epsilon, self.round_event, params.rounds,
            params.delta, params.accountant, self.adjacency, initial=self.initial_event(), floor=self.noise_floor)

    def round_event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        """One round: users Poisson-sampled with ``q_user``, one Gaussian of std ``z`` times the sensitivity."""
        return poisson_gaussian_round(self.params.q_user, noise_multiplier)

    def initial_event(self) -> dp_accounting.DpEvent | None:
        return self.population.event() if self.population is not None else None

    def epsilon(self, rounds: int | None = None) -> float:
        """Epsilon after ``rounds`` (default: all), as the run would report it."""
        p = self.params
        return epsilon_after(self.round_event(self.noise_multiplier), p.rounds if rounds is None else rounds, p.delta,
                             p.accountant, self.adjacency, initial=self.initial_event())

    def select(self, data: TrainData) -> Selection:
        """What the rounds train on (userdp: every sentence, users sampled by their own coins)."""
        return Selection(data, sampling=self)

    def denominator_for(self, population: Population) -> float:
        """``q_user * N``: the expected number of sampled users, fixed before training."""
        return self.params.q_user * population.value

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT) -> Trained:
        p, z = self.params, self.noise_multiplier
        selection = self.select(data)
        data = selection.data
        population = self.population or Population.public_by_adjacency(len(data.by_user))
        denominator = self.denominator_for(population)
        check_delta(p.delta, round(population.value))
        accountant = RoundAccountant(self.round_event(z), p.delta, p.accountant, self.adjacency,
                                     initial=self.initial_event())
        weights = user_weights(data, p.weight_cap)
        sigma = z * p.clip * WEIGHT_CEILING
        params = [q for q in model.parameters() if q.requires_grad]
        user_ids = list(data.by_user)
        user_sequences = list(data.by_user.values())
        with dropout_switched_off(model) as dropout:  # layers' own draws would be shared by all users
            trainer = self.local_trainer(model, loss_fn, device, data.pad_id)

            def one_round(_: int, rng: RoundRandomness) -> RoundOutput:
                sampled = rng.poisson_sample("sample-users", user_ids, p.q_user)
                streams = [rng.stream("local-batches", user_ids[i]) for i in sampled]
                theta = flatten(params)
                pending = noise_ahead([theta], sigma, rng.stream("noise"))  # drawn while the users train
                total = trainer.clipped_sum(theta, [user_sequences[i] for i in sampled], weights[sampled].tolist(),
                                            streams)
                noise = pending.result()[0]
                # theta + lr (total + noise) / denominator, in place: no model-sized temporaries
                assign_flat_(params, total.add_(noise).mul_(p.server_lr / denominator).add_(theta))
                return RoundOutput()  # neither the local losses nor the number of sampled users is released

            loop = RoundLoop(self.name, p.rounds, accountant, self.randomness, p.delta, p.max_epsilon,
                             state={"model": model})
            model.train()
            outcome = loop.run(one_round, on_round, checkpoint)
        statement = private_statement(
            self.name, self.unit, accountant, outcome, delta=p.delta, accountant=p.accountant, noise_multiplier=z,
            sampling_probability=p.q_user, randomness=self.randomness, population=population,
            extra={"noise_std": sigma, "sensitivity": p.clip * WEIGHT_CEILING, "denominator": denominator,
                   **selection.extra}, dropout_switched_off=dropout)
        return Trained(replace(statement, public=(*statement.public, *selection.public)), sampling=selection.sampling)

    def rounds_with(self, units: HostUnits, rounds: range) -> int:
        """Rounds of ``rounds`` that sample one of ``units.users`` (audit canaries)."""
        return int(self.randomness.sampled_in("sample-users", rounds, units.users, self.params.q_user).sum())

    def local_trainer(self, model: torch.nn.Module, loss_fn: LossFn, device: torch.device, pad_id: int) -> LocalTrainer:
        return make_local_trainer(self.params, model, loss_fn, device, pad_id)


def make_local_trainer(p: UserDpParams, model: torch.nn.Module, loss_fn: LossFn, device: torch.device,
                       pad_id: int) -> LocalTrainer:
    """The local-update engine of userdp and uedp: sequential or vectorized over users (same results)."""
    cls = VectorizedLocalTrainer if p.vectorize_users else LocalTrainer
    return cls(model, loss_fn, device, pad_id, p.clip, p.local_steps, p.local_batch_size, p.local_lr)


def _build(params: UserDpParams, context: BuildContext) -> UserDp:
    return UserDp(params, context.counted(), context.randomness)


def _plan(params: UserDpParams, population: Population) -> EpsilonPlan:
    mechanism = UserDp(params, population)
    z, epsilon = mechanism.noise_multiplier, mechanism.epsilon()
    return EpsilonPlan(epsilon, z, (f"userdp: epsilon = {epsilon:.4g} at delta = {params.delta:g} after {params.rounds} "
                                    f"rounds, z = {z:.4g} ({params.accountant}; unit: one user)",))


def check_vectorizable(params: UserDpParams, shape: RunShape) -> None:
    if params.vectorize_users and shape.model != "gpt2":
        raise ValueError("vectorize_users is implemented for GPT-2 language models only")


register(MechanismSpec(
    name="userdp", rank=30, summary="user-level DP by DP-FedAvg: per-user model deltas clipped and noised",
    params=UserDpParams, unit=UserDp.unit, guarantee="central", build=_build, counts="users",
    audit=AuditDesign("user"), plan=_plan, check=check_vectorizable, early_calibration=True,
    uses_categories=lambda p: False,  # no category changes what it trains: a sweep trains it once
))
