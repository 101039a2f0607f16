"""``uedp`` and ``uedp-naive``: UeDP-Alg (``uedp-user-entity-dp.txt``, Alg. 1), with the corrected
accounting of PRIVACY.md. The privacy unit is one user **and** one sensitive entity: every sentence of
that user and every sentence, of any user, that contains that entity.

Per round:

* Poisson-sample users (``q_user``), detected entities E (``q_entity``) and extended entities S
  (``q_extended``: one per sentence with no detected entity); if more than M users are drawn, keep a
  uniformly random M (M from :func:`privacy.accounting.max_sampled_users`, its failure charged to delta);
* each sampled user trains on its S sentences sampled this round and on its sensitive sentences **all**
  of whose entities were sampled (the AND rule; the paper's code used a sentence if *any* entity was);
  ``uedp-naive`` trains on sensitive sentences only;
* local update, delta clipped to ``clip`` and weighted as in userdp; noise
  ``sigma = z * max(w) * clip * (2M + 1)`` added once to the sum;
* estimator f_E+ (``uedp``): divide by ``q_user W_u (q_entity |E| + q_extended |S|)``; f_E
  (``uedp-naive``): by ``q_user W_u q_entity |E|``. Both are post-processing: they scale signal and noise
  alike, so choose ``server_lr`` accordingly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from privacy.accounting import UeDpAccounting, check_delta
from privacy.mechanisms.base import NO_CHECKPOINT, Checkpointer, LossFn, OnRound, PrivacyStatement, RoundReport, TrainData
from privacy.mechanisms.fedavg import WEIGHT_CEILING, user_weights
from privacy.mechanisms.userdp import UserDpParams, make_local_trainer
from privacy.primitives import assign_flat_, flatten, gaussian_noise, make_generator, poisson_sample


@dataclass
class UeDpParams(UserDpParams):
    """userdp's parameters plus the entity sampling rates; ``naive`` selects the f_E estimator."""

    q_entity: float = 0.5
    q_extended: float = 0.5
    truncation_share: float = 0.1  # share of delta charged to "more than M users sampled in some round"
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

    def __init__(self, params: UeDpParams, n_users: int):
        self.params = params
        self.name = "uedp-naive" if params.naive else "uedp"
        self.accounting = UeDpAccounting(n_users, params.q_user, params.q_entity, params.q_extended, params.rounds,
                                         params.delta, params.naive, params.truncation_share, params.accountant)
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

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT) -> PrivacyStatement:
        p, z = self.params, self.noise_multiplier
        if data.entities is None:
            raise ValueError(f"{self.name} needs the sentences' entity sets (TrainData.entities)")
        check_delta(p.delta, data.n_users)
        users = list(data.by_user)
        sequences = [data.by_user[u] for u in users]
        entity_sets = [data.entities[u] for u in users]
        entity_keys = sorted({key for sets in entity_sets for entities in sets for key in entities})
        # S sentences are numbered user by user: global index -> (owner, index within the owner's S list).
        extended_owner = [(u, local) for u, sets in enumerate(entity_sets)
                          for local in range(sum(1 for entities in sets if not entities))]
        n_extended = len(extended_owner)

        noise_gen = make_generator(p.seed, p.secure_noise, device)
        sample_gen = make_generator(p.seed + 1, p.secure_noise)
        trainer = make_local_trainer(p, model, loss_fn, device, data.pad_id)
        weights = user_weights(data, p.weight_cap)
        entity_mass = p.q_entity * len(entity_keys) + (0.0 if p.naive else p.q_extended * n_extended)
        denominator = p.q_user * float(weights.sum()) * max(entity_mass, 1e-12)
        sigma = z * self.sensitivity
        params = [q for q in model.parameters() if q.requires_grad]
        cases = self.accounting.round_accountants(z)  # epsilon = the worse of the E and S cases
        state = {"model": model, "noise": noise_gen, "sampling": sample_gen, "local": trainer.generator,
                 **{f"accountant_{case}": accountant for case, accountant in cases.items()}}
        saved = checkpoint.restore(self.name, state) or {"round": 0, "truncated": 0}
        rounds_run, truncated, stopped = saved["round"], saved["truncated"], ""
        epsilon = max(a.epsilon for a in cases.values())
        model.train()
        for round_index in range(rounds_run + 1, p.rounds + 1):
            next_epsilon = max(a.peek() for a in cases.values())
            if p.max_epsilon is not None and next_epsilon > p.max_epsilon:
                stopped = f"stopped before round {round_index}: epsilon would exceed the budget {p.max_epsilon:g}"
                break
            sampled_users = poisson_sample(len(users), p.q_user, sample_gen)
            if len(sampled_users) > self.accounting.max_users:
                keep = torch.randperm(len(sampled_users), generator=sample_gen)[: self.accounting.max_users]
                sampled_users = sorted(sampled_users[i] for i in keep.tolist())
                truncated += 1
            sampled_entities = {entity_keys[i] for i in poisson_sample(len(entity_keys), p.q_entity, sample_gen)} \
                if entity_keys else set()
            sampled_extended = set(poisson_sample(n_extended, p.q_extended, sample_gen)) if n_extended and not p.naive else set()
            extended_by_user: dict[int, set[int]] = {}
            for i in sampled_extended:
                owner, local = extended_owner[i]
                extended_by_user.setdefault(owner, set()).add(local)
            groups = []
            for u in sampled_users:
                used = usable_sequences(entity_sets[u], sampled_entities, extended_by_user.get(u, set()), p.naive)
                groups.append([sequences[u][i] for i in used])
            theta = flatten(params)
            total = trainer.clipped_sum(theta, groups, weights[sampled_users].tolist())
            noisy = total + gaussian_noise(theta.shape, sigma, noise_gen, theta.dtype)
            assign_flat_(params, theta + p.server_lr * noisy / denominator)
            epsilon, rounds_run = max(a.step() for a in cases.values()), round_index
            on_round(RoundReport(round_index, math.nan, epsilon, p.delta, len(sampled_users)))
            checkpoint.maybe_save(self.name, round_index, state, truncated=truncated)
        return PrivacyStatement(
            mechanism=self.name, unit=self.unit, epsilon=epsilon, delta=p.delta, accountant=p.accountant,
            noise_multiplier=z, sampling_probability=p.q_user, rounds=rounds_run, notes=stopped,
            extra={"noise_std": sigma, "sensitivity": self.sensitivity, "max_users_M": self.accounting.max_users,
                   "delta_truncation": self.accounting.delta_trunc, "rounds_truncated": truncated,
                   "entities_E": len(entity_keys), "extended_S": n_extended,
                   **{f"epsilon_case_{case}": a.epsilon for case, a in cases.items() if rounds_run}},
        )
