"""UeDP-Alg made sound (PRIVACY.md): AND rule, truncation bound, sensitivity on constructed
user-entity adjacent datasets, noise scale, case-wise accounting against dp_accounting, calibration."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats
from torch.nn.utils import parameters_to_vector
from typer.testing import CliRunner

from uedp.cli import app
from uedp.models.batching import encode
from uedp.models.metrics import causal_lm_loss
from uedp.privacy.accounting.events import epsilon_after, poisson_gaussian_round
from uedp.privacy.accounting.worst_case import UeDpAccounting, max_sampled_users
from uedp.privacy.mechanisms.base import TrainData
from uedp.privacy.mechanisms.fedavg import LocalTrainer
from uedp.privacy.mechanisms.uedp import UeDp, UeDpParams, usable_sequences
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness

from support import TOKENIZER
from support import tiny_gpt2 as _model

A, B = "PERSON:imelda okafor", "ORG:northgate clinic"


def test_and_rule_uses_a_sentence_only_when_all_its_entities_are_sampled() -> None:
    sets = [frozenset({A, B}), frozenset({A}), frozenset(), frozenset(), frozenset({B})]
    assert usable_sequences(sets, {A}, set(), naive=False) == [1]           # {A,B} needs B too
    assert usable_sequences(sets, {A, B}, {1}, naive=False) == [0, 1, 3, 4]  # second S sentence sampled
    assert usable_sequences(sets, {A, B}, {0, 1}, naive=True) == [0, 1, 4]   # naive: never S sentences
    assert usable_sequences(sets, set(), {0}, naive=False) == [2]


@pytest.mark.parametrize(("n", "q", "rounds", "delta"), [(946, 0.05, 500, 1e-6), (40, 0.5, 30, 1e-6), (10, 1.0, 5, 1e-6)])
def test_truncation_bound_is_the_smallest_meeting_its_delta(n: int, q: float, rounds: int, delta: float) -> None:
    m = max_sampled_users(n, q, rounds, delta)
    assert rounds * stats.binom.sf(m, n, q) <= delta
    assert m == 0 or rounds * stats.binom.sf(m - 1, n, q) > delta


def test_case_epsilons_follow_privacy_md_and_equal_dp_accounting() -> None:
    plan = UeDpAccounting(946, 0.05, 0.5, 1.0, 200, 1e-5, kind="rdp", epsilon_bound=10.0)
    m = plan.max_users
    p_e = 1 - 0.95 * 0.5
    p_s = 1 - 0.95 * (1 - 0.05 * 1.0)
    expected = {"E": epsilon_after(poisson_gaussian_round(p_e, 2.0), 200, 0.9e-5, "rdp"),
                "S": epsilon_after(poisson_gaussian_round(p_s, 2.0 * (2 * m + 1) / 3), 200, 0.9e-5, "rdp")}
    assert plan.epsilons(2.0) == pytest.approx(expected, rel=1e-12)
    # The truncation's share of delta pays for its failure probability times 1 + e^epsilon (total variation).
    assert plan.delta_trunc * (1 + math.exp(10.0)) + plan.delta_accountant == pytest.approx(1e-5)
    naive = UeDpAccounting(946, 0.05, 0.5, 1.0, 200, 1e-5, naive=True, kind="rdp", epsilon_bound=10.0)
    assert set(naive.epsilons(2.0)) == {"E"}


def test_paper_settings_cost_far_more_than_user_level_dp() -> None:
    """q_u=0.05, q_e=0.5, q_s=1, z=2, T=500 (the paper's Fig. 4): protecting entities spread over many
    users is much more expensive than protecting users, not cheaper as the paper's accounting claims."""
    uedp = UeDpAccounting(946, 0.05, 0.5, 1.0, 500, 1e-5, kind="rdp", epsilon_bound=100.0).epsilon(2.0)
    userdp = epsilon_after(poisson_gaussian_round(0.05, 2.0), 500, 1e-5, "rdp")
    assert 2 < userdp < 4
    assert uedp > 10 * userdp


@pytest.mark.parametrize("naive", [False, True])
def test_calibration_meets_the_target_in_every_case(naive: bool) -> None:
    plan = UeDpAccounting(200, 0.1, 0.2, 0.5, 50, 1e-5, naive=naive, kind="rdp", epsilon_bound=4.0)
    z = plan.calibrate(4.0)
    assert 0.99 * 4.0 <= plan.epsilon(z) <= 4.0


def _entity_user_data(users: int, with_entity: bool) -> TrainData:
    """Every user has one sentence mentioning the shared entity (present only in the adjacent dataset)
    and one harmless sentence."""
    by_user, entities = {}, {}
    for u in range(users):
        texts, sets = [f"harmless note number {u} about the weather"], [frozenset()]
        if with_entity:
            texts.append("Imelda Okafor at Northgate Clinic prescribed the new tablets today")
            sets.append(frozenset({A}))
        by_user[f"u{u}"] = encode(TOKENIZER, texts, 64)
        entities[f"u{u}"] = sets
    return TrainData(by_user, TOKENIZER.pad_token_id, entities)


def test_adding_an_entity_spread_over_users_moves_the_sum_beyond_the_papers_bound_but_within_delta_e() -> None:
    """D' = D plus user u' plus entity e' that appears in every user's text. With every user sampled,
    the noiseless clipped sum moves by more than the paper's Lemma 1 bound (q_u|U| + 1) max(w) beta,
    and never by more than Delta_E = (2M + 1) max(w) beta."""
    n, clip, q_u = 8, 0.05, 0.1
    model = _model()
    theta = parameters_to_vector(model.parameters()).detach().clone()

    root = Randomness.secure()

    def clipped_sum(data: TrainData, sampled_entities: set[str]) -> torch.Tensor:
        trainer = LocalTrainer(_model(), causal_lm_loss, torch.device("cpu"), data.pad_id, clip, 3, 8, 0.5)
        groups = []
        for user, seqs in data.by_user.items():
            extended = set(range(sum(1 for s in data.entities[user] if not s)))  # all S sentences sampled
            groups.append([seqs[i] for i in usable_sequences(data.entities[user], sampled_entities, extended, False)])
        streams = [root.stream("local-batches", 1, user) for user in data.by_user]  # as training derives them
        return trainer.clipped_sum(theta, groups, [1.0] * len(groups), streams)

    without = clipped_sum(_entity_user_data(n, with_entity=False), set())
    adjacent = _entity_user_data(n, with_entity=True)
    adjacent.by_user["u_new"] = encode(TOKENIZER, ["the added user writes about Imelda Okafor"], 64)
    adjacent.entities["u_new"] = [frozenset({A})]
    with_entity = clipped_sum(adjacent, {A})
    moved = float(torch.linalg.vector_norm(with_entity - without))
    paper_bound = (q_u * n + 1) * clip
    m = n + 1  # every user sampled: M can be no smaller
    assert moved > paper_bound
    assert moved <= (2 * m + 1) * clip * (1 + 1e-5)


def test_noise_standard_deviation_is_z_times_delta_e() -> None:
    z, clip = 1.3, 0.2
    data = _entity_user_data(6, with_entity=True)
    mechanism = UeDp(UeDpParams(rounds=1, q_user=0.5, q_entity=0.5, q_extended=0.5, noise_multiplier=z, clip=clip,
                                local_lr=0.0, local_steps=1, accountant="rdp"), Population.declared(data.n_users),
                     Randomness.secure())
    model = _model()
    before = parameters_to_vector(model.parameters()).detach().clone()
    statement = mechanism.train(model, data, causal_lm_loss, torch.device("cpu"), lambda r: None).statement
    # local_lr = 0: every delta is zero, so the update is noise / (q_user N (2M + 1)): fixed, from public figures.
    denominator = 0.5 * 6 * (2 * mechanism.accounting.max_users + 1)
    noise = (parameters_to_vector(model.parameters()).detach() - before) * denominator
    sigma = z * clip * (2 * mechanism.accounting.max_users + 1)
    chi = float((noise.double() ** 2).sum()) / sigma**2
    assert stats.chi2.ppf(1e-6, noise.numel()) <= chi <= stats.chi2.ppf(1 - 1e-6, noise.numel())
    assert statement.extra["noise_std"] == pytest.approx(sigma)


def test_training_reports_the_accountants_epsilon_each_round_and_is_seeded() -> None:
    data = _entity_user_data(6, with_entity=True)
    params = UeDpParams(rounds=3, q_user=0.5, noise_multiplier=1.5, local_steps=1, accountant="rdp")
    reports: list = []
    a, b = _model(), _model()
    population = Population.declared(data.n_users)
    statement = UeDp(params, population, Randomness.seeded(5)).train(a, data, causal_lm_loss, torch.device("cpu"),
                                                                     reports.append).statement
    UeDp(params, population, Randomness.seeded(5)).train(b, data, causal_lm_loss, torch.device("cpu"), lambda r: None)
    plan, _ = UeDpAccounting.for_run(population, 0.5, 0.5, 0.5, 3, 1e-5, False, 0.1, "rdp", 0.1, 1.5, None)
    assert [r.epsilon for r in reports] == pytest.approx([plan.epsilon(1.5, t) for t in (1, 2, 3)])
    assert statement.epsilon == pytest.approx(plan.epsilon(1.5)) and all(math.isnan(r.loss) for r in reports)
    assert torch.equal(parameters_to_vector(a.parameters()), parameters_to_vector(b.parameters()))


def test_epsilon_command_plans_without_training() -> None:
    runner = CliRunner()
    command = ["epsilon", "--mechanism", "uedp", "--users", "946", "--q-user", "0.05", "--q-entity", "0.05", "--steps",
               "100", "--noise-multiplier", "2", "--accountant", "rdp"]
    public = runner.invoke(app, [*command, "--count-public"])
    assert public.exit_code == 0, public.output
    # q_extended 0.5: what training uses
    plan, _ = UeDpAccounting.for_run(Population.declared(946), 0.05, 0.05, 0.5, 100, 1e-5, False, 0.1, "rdp", 0.1, 2.0,
                                     None)
    assert f"epsilon = {plan.epsilon(2.0):.4g}" in public.stdout and "userdp with the same q_user" in public.stdout
    # By default training composes a DP count of users and bounds N from it: the planner plans the same.
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.output
    counted = Population(946.0, "dp-count", 10.0)
    default, _ = UeDpAccounting.for_run(counted, 0.05, 0.05, 0.5, 100, 1e-5, False, 0.1, "rdp", 0.1, 2.0, None)
    assert f"epsilon = {default.epsilon(2.0):.4g}" in result.stdout and "DP count of writers" in result.stdout
    target = runner.invoke(app, ["epsilon", "--mechanism", "userdp", "--users", "946", "--q-user", "0.05", "--steps",
                                 "100", "--target-epsilon", "1", "--accountant", "rdp"])
    assert target.exit_code == 0 and ("epsilon = 1 " in target.stdout or "epsilon = 0.99" in target.stdout)
    both = runner.invoke(app, ["epsilon", "--mechanism", "uedp", "--users", "9", "--q-user", "0.5", "--steps", "3",
                               "--noise-multiplier", "1", "--target-epsilon", "2"])
    assert both.exit_code == 2 and "give at most one of noise_multiplier and target_epsilon" in both.stderr
    # Without either, the planner uses training's default noise multiplier (one default, defined once).
    default = runner.invoke(app, ["epsilon", "--mechanism", "userdp", "--users", "946", "--q-user", "0.05"])
    assert default.exit_code == 0 and "z = 1 " in default.stdout and "after 30 rounds" in default.stdout
