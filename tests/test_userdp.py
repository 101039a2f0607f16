"""DP-FedAvg (userdp) end to end on a tiny GPT-2: noise scale, sensitivity, accounting, budget, seeds."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats
from torch.nn.utils import parameters_to_vector

from uedp.models.batching import encode
from uedp.models.metrics import causal_lm_loss
from uedp.privacy.accounting.events import epsilon_after, poisson_gaussian_round
from uedp.privacy.mechanisms.base import RoundReport, TrainData
from uedp.privacy.mechanisms.userdp import UserDp, UserDpParams
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness

from support import TOKENIZER
from support import fedavg_data as _data
from support import tiny_gpt2 as _model


def _train(params: UserDpParams, model: torch.nn.Module | None = None, data: TrainData | None = None,
           randomness: Randomness | None = None):
    model = model or _model()
    data = data or _data()
    reports: list[RoundReport] = []
    mechanism = UserDp(params, Population.declared(data.n_users), randomness or Randomness.seeded(0))
    statement = mechanism.train(model, data, causal_lm_loss, torch.device("cpu"), reports.append).statement
    return model, reports, statement


def _streams(randomness: Randomness, users: list[str], round_index: int = 1) -> list:
    """Each user's own local-batch stream, derived as training derives it."""
    return [randomness.stream("local-batches", round_index, user) for user in users]


def test_added_noise_has_standard_deviation_z_times_clip() -> None:
    # local_lr = 0 makes every user's delta zero, so the server update is pure noise / (q W).
    z, clip, q = 1.7, 0.3, 0.5
    params = UserDpParams(rounds=1, q_user=q, noise_multiplier=z, clip=clip, local_lr=0.0, local_steps=1)
    model = _model()
    before = parameters_to_vector(model.parameters()).detach().clone()
    _, _, statement = _train(params, model, randomness=Randomness.secure())
    noise = (parameters_to_vector(model.parameters()).detach() - before) * q * 12 / params.server_lr
    n, sigma = noise.numel(), z * clip
    chi = float((noise.double() ** 2).sum()) / sigma**2
    assert stats.chi2.ppf(1e-6, n) <= chi <= stats.chi2.ppf(1 - 1e-6, n)
    assert statement.extra["noise_std"] == pytest.approx(sigma)


def test_adding_one_user_moves_the_clipped_sum_by_at_most_clip_with_the_real_local_randomness() -> None:
    """The run's own secret root, each user's own batch stream: adding a user reorders nobody else's batches."""
    params = UserDpParams(clip=0.05, local_lr=0.5, local_steps=3, local_batch_size=2, noise_multiplier=1.0)
    data = _data(users=5, per_user=6)
    mechanism = UserDp(params, Population.declared(5), Randomness.secure())
    ids = list(data.by_user)
    extra_user = encode(TOKENIZER, ["an extra user with a very different text: +44 7700 900123"] * 6, 48)
    model = _model()
    theta = parameters_to_vector(model.parameters()).detach().clone()
    root = Randomness.secure()

    def summed(users: list[list[torch.Tensor]], names: list[str]) -> torch.Tensor:
        trainer = mechanism.local_trainer(_model(), causal_lm_loss, torch.device("cpu"), data.pad_id)
        return trainer.clipped_sum(theta, users, [1.0] * len(users), _streams(root, names))

    # The added user comes first: with one shared stream it would reorder every later user's batches.
    without = summed(list(data.by_user.values()), ids)
    with_extra = summed([extra_user, *data.by_user.values()], ["u-new", *ids])
    moved = float(torch.linalg.vector_norm(with_extra - without))
    assert moved <= params.clip * (1 + 1e-5)
    assert moved > 0.99 * params.clip  # clipping was active: the raw delta is larger than clip


def test_reported_epsilon_is_the_accountants_for_each_round() -> None:
    params = UserDpParams(rounds=4, q_user=0.25, noise_multiplier=1.3, local_steps=1, accountant="rdp")
    _, reports, statement = _train(params)
    expected = [epsilon_after(poisson_gaussian_round(0.25, 1.3), t, 1e-5, "rdp") for t in range(1, 5)]
    assert [r.epsilon for r in reports] == pytest.approx(expected, rel=1e-12)
    assert statement.epsilon == pytest.approx(expected[-1]) and statement.rounds == 4
    assert all(math.isnan(r.loss) for r in reports)  # private-data losses are not released


def test_target_epsilon_is_met_by_the_calibrated_noise() -> None:
    params = UserDpParams(rounds=3, q_user=0.5, noise_multiplier=None, target_epsilon=5.0, local_steps=1, accountant="rdp")
    _, _, statement = _train(params)
    assert statement.epsilon <= 5.0 and statement.epsilon >= 0.99 * 5.0
    assert statement.noise_multiplier > 0.3


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_training_stops_before_a_round_would_exceed_the_budget(accountant: str) -> None:
    def exact(rounds: int) -> float:
        return epsilon_after(poisson_gaussian_round(0.5, 1.0), rounds, 1e-5, accountant)  # type: ignore[arg-type]

    budget = exact(2) + 1e-6
    assert exact(3) > budget  # round 3 would exceed it: the stop is exact, not a block's end
    params = UserDpParams(rounds=10, q_user=0.5, noise_multiplier=1.0, local_steps=1, accountant=accountant,
                          max_epsilon=budget)
    _, reports, statement = _train(params)
    assert len(reports) == 2 and statement.rounds == 2 and statement.epsilon <= budget
    assert [r.epsilon for r in reports] == pytest.approx([exact(1), exact(2)], rel=1e-7)
    assert statement.epsilon == reports[-1].epsilon  # the curve ends at the final figure
    assert "stopped before round 3: epsilon would exceed the budget" in statement.notes


def test_seeded_runs_replay_and_secure_runs_differ() -> None:
    params = UserDpParams(rounds=2, q_user=0.5, local_steps=2, accountant="rdp")
    a, _, seeded = _train(params, randomness=Randomness.seeded(11))
    b, _, _ = _train(params, randomness=Randomness.seeded(11))
    c, _, _ = _train(params, randomness=Randomness.seeded(12))
    d, _, secure = _train(params, randomness=Randomness.secure())
    e, _, _ = _train(params, randomness=Randomness.secure())
    va, vb, vc, vd, ve = (parameters_to_vector(m.parameters()) for m in (a, b, c, d, e))
    assert torch.equal(va, vb)
    assert not torch.equal(va, vc) and not torch.equal(vd, ve)
    assert seeded.randomness == "seeded" and any("does not hold against anyone who knows" in c for c in seeded.caveats)
    assert secure.randomness == "secure" and not secure.caveats


def test_local_update_leaves_the_global_weights_untouched() -> None:
    mechanism = UserDp(UserDpParams(local_lr=0.5, local_steps=2), Population.declared(2))
    model = _model()
    theta = parameters_to_vector(model.parameters()).detach().clone()
    copy = theta.clone()
    data = _data(users=2)
    trainer = mechanism.local_trainer(_model(), causal_lm_loss, torch.device("cpu"), data.pad_id)
    total = trainer.clipped_sum(theta, list(data.by_user.values()), [1.0, 1.0], _streams(Randomness.secure(), ["a", "b"]))
    assert torch.equal(theta, copy)
    assert float(torch.linalg.vector_norm(total)) > 0
