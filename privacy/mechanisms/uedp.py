"""``uedp`` and ``uedp-naive``: UeDP-Alg (``uedp-user-entity-dp.txt``, Alg. 1), with the corrected
accounting of PRIVACY.md. The privacy unit is one user **and** one sensitive entity: every sentence of
that user and every sentence, of any user, that contains that entity.

Per round:

* only *anchored* writers take part: those with at least one sentence that names no detected entity of
  the chosen categories (:func:`privacy.population.anchored_users`). One entity's sentences can make any
  number of writers, so no count of all writers moves by at most one; the number of anchored writers
  does, and it is what the DP count counts and M is derived from;
* Poisson-sample users (``q_user``), detected entities E (``q_entity``) and extended entities S
  (``q_extended``: one per sentence with no detected entity), each unit by its own coin; if more than M
  users are drawn, keep a uniformly random M (M from :func:`privacy.accounting.worst_case.max_sampled_users` on a
  public or DP upper bound of the number of users; the chance p that truncation or the bound ever fails
  costs ``p (1 + e^epsilon)`` of delta, :class:`privacy.accounting.worst_case.UeDpAccounting`);
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
  the server optimizer (``server_lr`` with sgd, momentum or Adam) is applied to the released average.
"""

from __future__ import annotations

import torch

from uedp.privacy.accounting.calibration import check_delta
from uedp.privacy.accounting.worst_case import UeDpAccounting
from uedp.privacy.layer_randomness import dropout_switched_off
from uedp.privacy.mechanisms.base import (
    NO_CHECKPOINT,
    Checkpointer,
    HostUnits,
    LossFn,
    OnRound,
    TrainData,
    Trained,
)
from uedp.privacy.mechanisms.fedavg import WEIGHT_CEILING
from uedp.privacy.mechanisms.loop import RoundLoop, RoundOutput, WorstCaseAccountant, planned_epsilon, private_statement
from uedp.privacy.mechanisms.params import UeDpParams
from uedp.privacy.mechanisms.userdp import (
    make_local_trainer,
    server_notes,
    server_optimizer,
    server_state,
)
from uedp.privacy.population import Population, anchored_users
from uedp.privacy.primitives import assign_flat_, flatten, noise_ahead
from uedp.privacy.randomness import Randomness, RoundRandomness
from uedp.privacy.signal import NoiseToSignal

__all__ = ["ANCHORED_NOTE", "UeDp", "UeDpParams", "anchored", "usable_sequences"]

ANCHORED_NOTE = ("uedp trains the writers with at least one sentence that names no detected entity of the chosen "
                 "categories, and counts those: one entity's sentences could make any number of other writers, so "
                 "no count of all writers moves by at most one; a writer whose every sentence names an entity does "
                 "not train")


def anchored(data: TrainData) -> TrainData:
    """``data`` restricted to :func:`anchored_users` (the redacted text and masks are not uedp's)."""
    if data.entities is None:
        raise ValueError("uedp needs the sentences' entity sets (TrainData.entities)")
    users = anchored_users(data.entities)
    return TrainData({u: data.by_user[u] for u in users}, data.pad_id, {u: data.entities[u] for u in users},
                     max_len=data.max_len)


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
    unit = UeDpParams.unit_words

    def __init__(self, params: UeDpParams, population: Population, randomness: Randomness | None = None):
        self.params = params
        self.population = population
        self.randomness = randomness or Randomness.secure()
        self.name: str = params.mechanism
        self.accounting, self.noise_multiplier = UeDpAccounting.for_run(
            population, params.q_user, params.q_entity, params.q_extended, params.rounds, params.delta,
            params.naive, params.truncation_share, params.accountant, params.count_bound_share,
            params.noise_multiplier, params.target_epsilon)

    @property
    def sensitivity(self) -> float:
        """``Delta_E = max(w) * clip * (2M + 1)``."""
        return WEIGHT_CEILING * self.params.clip * self.accounting.sensitivity_factor

    def run_accountant(self) -> WorstCaseAccountant:
        """The run's accounting: the worse of the E and S cases, planned together."""
        return WorstCaseAccountant(self.accounting.round_accountants(self.noise_multiplier))

    def planned_epsilon(self) -> float:
        """The epsilon this run will state if it runs its planned rounds (or up to its budget stop)."""
        return planned_epsilon(self.run_accountant(), self.params.rounds, self.params.max_epsilon)

    @property
    def denominator(self) -> float:
        """``q_user * N * (2M + 1)``: fixed before training, from public or DP figures only."""
        return self.params.q_user * self.population.value * self.accounting.sensitivity_factor

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT) -> Trained:
        p, z = self.params, self.noise_multiplier
        if data.entities is None:
            raise ValueError(f"{self.name} needs the sentences' entity sets (TrainData.entities)")
        check_delta(p.delta, round(self.population.value))
        data = anchored(data)
        assert data.entities is not None  # anchored() keeps them
        users = list(data.by_user)
        sequences = [data.by_user[u] for u in users]
        entity_sets = [data.entities[u] for u in users]
        entity_keys = sorted({key for sets in entity_sets for entities in sets for key in entities})
        # S sentences are identified by their owner and their place in the owner's S list.
        extended_owner = [(u, local) for u, sets in enumerate(entity_sets)
                          for local in range(sum(1 for entities in sets if not entities))]
        extended_ids = [f"{users[u]}#{local}" for u, local in extended_owner]

        sigma = z * self.sensitivity
        params = [q for q in model.parameters() if q.requires_grad]
        run_accountant = self.run_accountant()

        def one_round(_: int, rng: RoundRandomness) -> RoundOutput:
            sampled_users = rng.poisson_sample("sample-users", users, p.q_user)
            kept = rng.keep_at_most("truncate-users", [users[u] for u in sampled_users], self.accounting.max_users)
            sampled_users = [sampled_users[i] for i in kept]
            sampled_entities = {entity_keys[i] for i in rng.poisson_sample("sample-entities", entity_keys, p.q_entity)}
            sampled_extended = set() if p.naive else set(rng.poisson_sample("sample-extended", extended_ids,
                                                                            p.q_extended))
            extended_by_user: dict[int, set[int]] = {}
            for i in sampled_extended:
                owner, local = extended_owner[i]
                extended_by_user.setdefault(owner, set()).add(local)
            groups = []
            for u in sampled_users:
                used = usable_sequences(entity_sets[u], sampled_entities, extended_by_user.get(u, set()), p.naive)
                groups.append([sequences[u][i] for i in used])
            streams = [rng.stream("local-batches", users[u]) for u in sampled_users]
            theta = flatten(params)
            pending = noise_ahead([theta], sigma, rng.stream("noise"))  # drawn while the users train
            total = trainer.clipped_sum(theta, groups, [WEIGHT_CEILING] * len(groups), streams)
            noise = pending.result()[0]
            # the released average (total + noise) / denominator, then the server's step, in place
            step = server.step_(total.add_(noise).div_(self.denominator))
            update_norm = float(step.norm())  # of the step the released average gave: public, watched
            assign_flat_(params, step.add_(theta))
            return RoundOutput(update_norm=update_norm)

        with dropout_switched_off(model) as dropout:  # layers' own draws would be shared by all users
            trainer = make_local_trainer(p, model, loss_fn, device, data.pad_id, data.max_len)
            server = server_optimizer(p)
            loop = RoundLoop(self.name, p.rounds, run_accountant, self.randomness, p.delta, p.max_epsilon,
                             state={"model": model, **server_state(server)})
            model.train()
            outcome = loop.run(one_round, on_round, checkpoint)
        return Trained(private_statement(
            self.name, self.unit, run_accountant, outcome, delta=p.delta, accountant=p.accountant, noise_multiplier=z,
            sampling_probability=p.q_user, randomness=self.randomness, population=self.population,
            extra={"noise_std": sigma, "sensitivity": self.sensitivity, "max_users_M": self.accounting.max_users,
                   "users_bound_for_M": self.accounting.n_users_bound, "denominator": self.denominator,
                   "delta_truncation": self.accounting.delta_trunc, "delta_count_bound": self.accounting.delta_bound,
                   **{f"epsilon_case_{case}": a.epsilon for case, a in run_accountant.cases.items() if outcome.rounds}},
            dropout_switched_off=dropout, notes=(ANCHORED_NOTE, *server_notes(server, p, data.max_len))), sampling=self)

    def noise_to_signal(self, units: float) -> NoiseToSignal:
        """Noise ``z (2M + 1) clip`` beside at most ``q_user N`` sampled users' clipped deltas: the
        (2M + 1)-fold sensitivity is what makes uedp's averaged update mostly noise."""
        p = self.params
        return NoiseToSignal(self.name, self.noise_multiplier * self.sensitivity, p.clip, p.q_user * units,
                             "server-sgd", ("uedp-bounded, whose noise does not grow with M",),
                             fixed_noise=p.target_epsilon is None)

    def rounds_with(self, units: HostUnits, rounds: range) -> int:
        """Rounds of ``rounds`` that sample the canary's entity and one of its host users (before the
        truncation to M users, which may still drop the host)."""
        p = self.params
        users = self.randomness.sampled_in("sample-users", rounds, units.users, p.q_user)
        return int((users & self.randomness.sampled_in("sample-entities", rounds, units.entities, p.q_entity)).sum())
