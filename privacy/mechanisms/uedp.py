"""``uedp`` and ``uedp-naive``: UeDP-Alg (``uedp-user-entity-dp.txt``, Alg. 1), with the corrected
accounting of PRIVACY.md. The privacy unit is one user **and** one sensitive entity: every sentence of
that user and every sentence, of any user, that contains that entity.

Per round:

* Poisson-sample users (``q_user``), detected entities E (``q_entity``) and extended entities S
  (``q_extended``: one per sentence with no detected entity), each unit by its own coin; if more than M
  users are drawn, keep a uniformly random M (M from :func:`privacy.accounting.max_sampled_users` on a
  public or DP upper bound of the number of users, its failure charged to delta);
* each sampled user trains on its S sentences sampled this round and on its sensitive sentences **all**
  of whose entities were sampled (the AND rule; the paper's code used a sentence if *any* entity was);
  ``uedp-naive`` trains on sensitive sentences only;
* local update from the user's own batch stream, delta clipped to ``clip``, weight 1 (a weight counting
  a user's sentences would change when an entity is added, even in rounds where it is not sampled);
  noise ``sigma = z * clip * (2M + 1)`` added once to the sum;
* divide by the fixed ``q_user * N * (2M + 1)`` (N public or a DP count, M derived from it): the noise
  in the update then has userdp's per-round scale, and the signal is (2M + 1) times smaller, which is
  the price of the unit, shown rather than hidden (dividing by ``q_user * N`` alone makes the noise
  (2M + 1) times userdp's and the model diverges). The paper's estimators divide by ``|E|`` and ``|S|``,
  exact counts of private data that the update's scale would reveal. Any constant is post-processing;
  ``server_lr`` scales it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from uedp.privacy.accounting import COUNT_BOUND_SHARE, UeDpAccounting, check_delta
from uedp.privacy.mechanisms.base import NO_CHECKPOINT, Checkpointer, LossFn, OnRound, PrivacyStatement, RoundReport, TrainData
from uedp.privacy.mechanisms.fedavg import WEIGHT_CEILING
from uedp.privacy.mechanisms.userdp import UserDpParams, make_local_trainer
from uedp.privacy.population import Population
from uedp.privacy.primitives import assign_flat_, flatten, gaussian_noise
from uedp.privacy.randomness import Randomness


@dataclass
class UeDpParams(UserDpParams):
    """userdp's parameters plus the entity sampling rates; ``naive`` selects the f_E estimator."""

    q_entity: float = 0.5
    q_extended: float = 0.5
    truncation_share: float = 0.1  # share of delta charged to "more than M users sampled in some round"
    count_bound_share: float = COUNT_BOUND_SHARE  # share of delta charged to a failed DP upper bound on the users
    naive: bool = False


def usable_sequences(entity_sets: list[frozenset[str]], sampled_entities: set[str], sampled_extended: set[int],
                     naive: bool) -> list[int]:
    """Indices of a user's sentences it may train on this round (the AND rule).

    A sensitive sentence is used only when every one of its entities was sampled; a sentence with no
    entity (extended entity number ``i`` of this user's S list, in order) when it was sampled itself.
    """
    used, extended_index = [], 0
    for index, entities in enumerate(entity_sets):
        if entities:
            if entities <= sampled_entities:
                used.append(index)
        else:
            if not naive and extended_index in sampled_extended:
                used.append(index)
            extended_index += 1
    return used


class UeDp:
    unit = "one user and one sensitive entity (all sentences of the user, and all sentences with the entity)"

    def __init__(self, params: UeDpParams, population: Population, randomness: Randomness | None = None):
        if params.weight_cap != 1.0:
            raise ValueError("uedp weighs every user 1: a weight counting a user's sentences changes when an entity "
                             "is added, even in rounds where it is not sampled (leave weight_cap at 1)")
        self.params = params
        self.population = population
        self.randomness = randomness or Randomness.secure()
        self.name = "uedp-naive" if params.naive else "uedp"
        self.accounting = UeDpAccounting.for_population(
            population, params.q_user, params.q_entity, params.q_extended, params.rounds, params.delta, params.naive,
            params.truncation_share, params.accountant, params.count_bound_share)
        if params.target_epsilon is not None:
            self.noise_multiplier = self.accounting.calibrate(params.target_epsilon)
        elif params.noise_multiplier and params.noise_multiplier > 0:
            self.noise_multiplier = params.noise_multiplier
        else:
            raise ValueError(f"{self.name} needs a positive noise multiplier or a target epsilon")

    @property
    def sensitivity(self) -> float:
        """``Delta_E = max(w) * clip * (2M + 1)``."""
        return WEIGHT_CEILING * self.params.clip * self.accounting.sensitivity_factor

    @property
    def denominator(self) -> float:
        """``q_user * N * (2M + 1)``: fixed before training, from public or DP figures only."""
        return self.params.q_user * self.population.value * self.accounting.sensitivity_factor

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT) -> PrivacyStatement:
        p, z, rng = self.params, self.noise_multiplier, self.randomness
        if data.entities is None:
            raise ValueError(f"{self.name} needs the sentences' entity sets (TrainData.entities)")
        check_delta(p.delta, round(self.population.value))
        users = list(data.by_user)
        sequences = [data.by_user[u] for u in users]
        entity_sets = [data.entities[u] for u in users]
        entity_keys = sorted({key for sets in entity_sets for entities in sets for key in entities})
        # S sentences are identified by their owner and their place in the owner's S list.
        extended_owner = [(u, local) for u, sets in enumerate(entity_sets)
                          for local in range(sum(1 for entities in sets if not entities))]
        extended_ids = [f"{users[u]}#{local}" for u, local in extended_owner]

        trainer = make_local_trainer(p, model, loss_fn, device, data.pad_id)
        sigma = z * self.sensitivity
        params = [q for q in model.parameters() if q.requires_grad]
        cases = self.accounting.round_accountants(z)  # epsilon = the worse of the E and S cases
        state = {"model": model, **{f"accountant_{case}": accountant for case, accountant in cases.items()}}
        rounds_run = (checkpoint.restore(self.name, state) or {"round": 0})["round"]
        stopped = ""
        epsilon = max(a.epsilon for a in cases.values())
        model.train()
        for round_index in range(rounds_run + 1, p.rounds + 1):
            next_epsilon = max(a.peek() for a in cases.values())
            if p.max_epsilon is not None and next_epsilon > p.max_epsilon:
                stopped = f"stopped before round {round_index}: epsilon would exceed the budget {p.max_epsilon:g}"
                break
            sampled_users = rng.poisson_sample("sample-users", round_index, users, p.q_user)
            kept = rng.keep_at_most("truncate-users", round_index, [users[u] for u in sampled_users],
                                    self.accounting.max_users)
            sampled_users = [sampled_users[i] for i in kept]
            sampled_entities = {entity_keys[i] for i in rng.poisson_sample("sample-entities", round_index, entity_keys,
                                                                           p.q_entity)}
            sampled_extended = set() if p.naive else set(rng.poisson_sample("sample-extended", round_index,
                                                                            extended_ids, p.q_extended))
            extended_by_user: dict[int, set[int]] = {}
            for i in sampled_extended:
                owner, local = extended_owner[i]
                extended_by_user.setdefault(owner, set()).add(local)
            groups = []
            for u in sampled_users:
                used = usable_sequences(entity_sets[u], sampled_entities, extended_by_user.get(u, set()), p.naive)
                groups.append([sequences[u][i] for i in used])
            streams = [rng.stream("local-batches", round_index, users[u]) for u in sampled_users]
            theta = flatten(params)
            total = trainer.clipped_sum(theta, groups, [WEIGHT_CEILING] * len(groups), streams)
            noise = gaussian_noise(theta.shape, sigma, rng.stream("noise", round_index), theta.dtype, theta.device)
            assign_flat_(params, theta + p.server_lr * (total + noise) / self.denominator)
            epsilon, rounds_run = max(a.step() for a in cases.values()), round_index
            on_round(RoundReport(round_index, math.nan, epsilon, p.delta))
            checkpoint.maybe_save(self.name, round_index, state)
        return PrivacyStatement(
            mechanism=self.name, unit=self.unit, epsilon=epsilon, delta=p.delta, accountant=p.accountant,
            noise_multiplier=z, sampling_probability=p.q_user, rounds=rounds_run, notes=stopped,
            extra={"noise_std": sigma, "sensitivity": self.sensitivity, "max_users_M": self.accounting.max_users,
                   "users_bound_for_M": self.accounting.n_users_bound, "population_used": self.population.value,
                   "denominator": self.denominator, "delta_truncation": self.accounting.delta_trunc,
                   "delta_count_bound": self.accounting.delta_bound,
                   **{f"epsilon_case_{case}": a.epsilon for case, a in cases.items() if rounds_run}},
            randomness=rng.mode, public=(self.population.describe(),), caveats=rng.caveats,
        )
