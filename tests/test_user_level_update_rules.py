"""The update rules of the user-level mechanisms: the server optimizers against a plain reference, the
defaults each takes, what they release (nothing new: a function of the released averages), a run with one
training as the rule says; and user-level DP-SGD (``local_update=gradient``): one clipped gradient per
user, whose adjacency is DP-FedAvg's, checked with the run's real randomness."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from uedp.models.batching import batches
from uedp.models.metrics import causal_lm_loss
from uedp.privacy.mechanisms.params import UeDpBoundedParams, UeDpParams, UserDpParams
from uedp.privacy.mechanisms.server_optimizer import ServerOptimizer
from uedp.privacy.mechanisms.userdp import UserDp
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness

from support import fedavg_data, move_by_one_added_user, tiny_gpt2


def _updates(rounds: int = 5, size: int = 7) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(size, generator=generator, dtype=torch.float64) for _ in range(rounds)]


def _apply(server: ServerOptimizer, updates: list[torch.Tensor]) -> torch.Tensor:
    theta = torch.zeros_like(updates[0])
    for update in updates:
        theta += server.step_(update.clone())
    return theta


def test_sgd_adds_the_learning_rate_times_each_update() -> None:
    updates = _updates()
    assert torch.allclose(_apply(ServerOptimizer("sgd", 0.3), updates), 0.3 * sum(updates))  # type: ignore[arg-type]


def test_momentum_is_the_heavy_ball_on_the_released_updates() -> None:
    updates, beta, lr = _updates(), 0.8, 0.5
    theta, m = torch.zeros(7, dtype=torch.float64), torch.zeros(7, dtype=torch.float64)
    for update in updates:
        m = beta * m + update
        theta = theta + lr * m
    assert torch.allclose(_apply(ServerOptimizer("momentum", lr, beta1=beta), updates), theta)


def test_adam_is_reddi_et_al_fedadam_without_bias_correction() -> None:
    updates, lr, b1, b2, tau = _updates(), 0.01, 0.9, 0.99, 1e-3
    theta, m, v = (torch.zeros(7, dtype=torch.float64) for _ in range(3))
    for update in updates:
        m = b1 * m + (1 - b1) * update
        v = b2 * v + (1 - b2) * update**2
        theta = theta + lr * m / (v.sqrt() + tau)
    server = ServerOptimizer("adam", lr, beta1=b1, beta2=b2, tau=tau)
    assert torch.allclose(_apply(server, updates), theta)
    # each coordinate's first step is about lr, whatever the update's scale
    first = ServerOptimizer("adam", lr).step_(torch.tensor([1e-6, 1.0, -1e3], dtype=torch.float64))
    assert torch.allclose(first.abs(), torch.tensor([lr * 0.1e-6 / (0.1e-6 + 1e-3), lr * 0.1 / (0.1 + 1e-3),
                                                     lr * 100 / (100 + 1e-3)], dtype=torch.float64))


def test_a_restored_optimizer_goes_on_as_the_uninterrupted_one() -> None:
    updates = _updates(rounds=6)
    whole = _apply(ServerOptimizer("adam", 0.01), updates)
    first = ServerOptimizer("adam", 0.01)
    theta = _apply(first, updates[:3])
    state = first.state_dict()
    resumed = ServerOptimizer("adam", 0.01)
    resumed.load_state_dict(state)
    assert torch.allclose(theta + _apply(resumed, updates[3:]), whole)
    with pytest.raises(ValueError, match="momentum"):
        ServerOptimizer("momentum", 0.1).load_state_dict(state)


@pytest.mark.parametrize("params", [UserDpParams, UeDpBoundedParams, UeDpParams])
def test_each_optimizer_takes_its_own_default_learning_rate_unless_one_is_given(params: type[UserDpParams]) -> None:
    assert params(noise_multiplier=1.0).server_lr == 1.0
    assert params(noise_multiplier=1.0, server_optimizer="momentum").server_lr == pytest.approx(0.1)
    assert params(noise_multiplier=1.0, server_optimizer="adam").server_lr == pytest.approx(1e-3)
    assert params(noise_multiplier=1.0, server_optimizer="adam", server_lr=0.05).server_lr == pytest.approx(0.05)


def test_a_round_with_adam_applies_adams_step_to_the_released_average() -> None:
    """One round, local_lr 0: the released average is pure noise / (q N); Adam's first step from zero moments
    is lr * 0.1 n / (0.1 |n| + tau) per coordinate, so every weight moves by just under lr."""
    lr, q = 1e-3, 0.5
    params = UserDpParams(rounds=1, q_user=q, noise_multiplier=2.0, local_lr=0.0, local_steps=1,
                          server_optimizer="adam", server_lr=lr)
    model = tiny_gpt2()
    before = parameters_to_vector(model.parameters()).detach().clone()
    data = fedavg_data()
    trained = UserDp(params, Population.declared(data.n_users), Randomness.seeded(0)).train(
        model, data, causal_lm_loss, torch.device("cpu"), lambda report: None)
    moved = (parameters_to_vector(model.parameters()).detach() - before).abs()
    assert float(moved.max()) <= lr * (1 + 1e-4) and float(moved.median()) > 0.9 * lr
    assert "server optimizer adam" in trained.statement.notes and "costs no epsilon" in trained.statement.notes


def test_gradient_mode_is_one_step_at_rate_one_with_adam_and_refuses_other_local_settings() -> None:
    p = UserDpParams(noise_multiplier=1.0, local_update="gradient")
    assert (p.local_steps, p.local_lr, p.server_optimizer, p.server_lr) == (1, 1.0, "adam", pytest.approx(1e-3))
    assert UserDpParams(noise_multiplier=1.0, local_update="gradient", server_optimizer="sgd").server_lr == 1.0
    assert UeDpBoundedParams(noise_multiplier=1.0, local_update="gradient").local_steps == 1
    with pytest.raises(ValueError, match="local_steps 3 would make it local SGD"):
        UserDpParams(noise_multiplier=1.0, local_update="gradient", local_steps=3)
    with pytest.raises(ValueError, match=r"local_lr 0\.5"):
        UserDpParams(noise_multiplier=1.0, local_update="gradient", local_lr=0.5)


def test_in_gradient_mode_a_user_returns_minus_the_gradient_of_one_batch_of_its_own_sentences() -> None:
    params = UserDpParams(noise_multiplier=1.0, local_update="gradient", local_batch_size=3, clip=1e9)
    data = fedavg_data(users=1, per_user=5)
    (sequences,) = data.by_user.values()
    model = tiny_gpt2()
    theta = parameters_to_vector(model.parameters()).detach().clone()
    mechanism = UserDp(params, Population.declared(1))
    root = Randomness.seeded(4)
    trainer = mechanism.local_trainer(tiny_gpt2(), causal_lm_loss, torch.device("cpu"), data.pad_id)
    delta = trainer.clipped_sum(theta, [sequences], [1.0], [root.stream("local-batches", 1, "u0")])
    # the same batch, drawn from the same stream, and its gradient by an ordinary backward pass
    batch = next(iter(batches(sequences, 3, data.pad_id, root.stream("local-batches", 1, "u0"))))
    model.zero_grad()
    causal_lm_loss(model, batch).backward()  # type: ignore[call-arg]
    gradient = torch.cat([q.grad.reshape(-1) for q in model.parameters()])  # type: ignore[union-attr]
    assert torch.allclose(delta, -gradient, atol=1e-6)


def test_in_gradient_mode_adding_one_user_moves_the_clipped_sum_by_at_most_clip() -> None:
    """With a secret root and each user's own stream, as a run draws them; the added user comes first, so a
    shared stream would reorder every other user's batch."""
    params = UserDpParams(noise_multiplier=1.0, local_update="gradient", local_batch_size=2, clip=0.05)
    moved = move_by_one_added_user(params)
    assert 0.99 * params.clip < moved <= params.clip * (1 + 1e-5)  # clipping was active, and bounded the move


# --- the planner's choice of q_user and rounds --------------------------------------------------------------

def _userdp_plan(users: float, target: float = 8.0):
    from uedp.privacy.mechanisms.registry import get

    params = UserDpParams(target_epsilon=target, accountant="rdp")
    population = Population.declared(round(users))

    @functools.cache  # the test asks a split's plan again: calibrations take seconds each
    def plan(q_user: float, rounds: int):
        planned = get("userdp").quote(params.model_copy(update={"q_user": q_user, "rounds": rounds}), population)
        return planned.noise_multiplier, planned.noise_to_signal

    return plan


def test_the_chosen_split_is_the_least_noisy_within_the_budget_and_meets_the_target() -> None:
    from uedp.privacy.mechanisms.auto_sampling import MIN_COHORT, choose_sampling

    users, budget = 60.0, 1200.0  # few users: few candidates above the least cohort, each quick to calibrate
    plan = _userdp_plan(users)
    choice = choose_sampling(plan, users, budget, min_rounds=10)
    assert len(choice.candidates) >= 4
    for c in choice.candidates:
        assert c.rounds >= 10 and c.q_user * users >= MIN_COHORT
        assert c.q_user * users * c.rounds == pytest.approx(budget, rel=0.05)  # each is a split of the budget
        assert c.signal.ratio == pytest.approx(plan(c.q_user, c.rounds)[1].ratio)  # planned at the target
    best = min(choice.candidates, key=lambda c: c.signal.ratio)
    assert (choice.q_user, choice.rounds) == (best.q_user, best.rounds)
    assert f"q_user {choice.q_user:.3g} and {choice.rounds} rounds chosen" in choice.reason
    assert sum(line.lstrip().startswith("*") for line in choice.table()) == 1
    # at the chosen split the run's own mechanism reaches the target epsilon, not more
    chosen = UserDp(UserDpParams(target_epsilon=8.0, accountant="rdp", q_user=choice.q_user, rounds=choice.rounds),
                    Population.declared(60))
    assert 7.9 <= chosen.planned_epsilon() <= 8.0


def test_a_budget_too_small_for_the_least_cohort_is_refused_naming_what_to_raise() -> None:
    from uedp.privacy.mechanisms.auto_sampling import choose_sampling

    with pytest.raises(ValueError, match="raise the budget"):
        choose_sampling(_userdp_plan(1000.0), 1000.0, budget=50.0, min_rounds=10)


def test_uedp_epsilon_chooses_the_split_prints_its_candidates_and_plans_it() -> None:
    import re

    from typer.testing import CliRunner

    from uedp.commands import app

    runner = CliRunner()
    planned = runner.invoke(app, ["epsilon", "--mechanism", "userdp", "--users", "60", "--target-epsilon", "8",
                                  "--choose-sampling", "--user-updates", "1200", "--set", "accountant=rdp",
                                  "--count-public"])
    assert planned.exit_code == 0, planned.output
    chosen = re.search(r"q_user ([0-9.]+) and (\d+) rounds chosen", planned.output)
    assert chosen is not None and len(re.findall(r"^ {2}[ *] q_user", planned.output, re.M)) >= 4
    q_user, rounds = float(chosen.group(1)), int(chosen.group(2))
    assert f"after {rounds} rounds" in planned.output  # the plan printed is the chosen split's
    assert q_user * 60 * rounds == pytest.approx(1200, rel=0.05)
    fixed = runner.invoke(app, ["epsilon", "--mechanism", "userdp", "--users", "300", "--noise-multiplier", "1",
                                "--choose-sampling"])
    assert fixed.exit_code == 2 and "give --target-epsilon" in fixed.stderr


def test_planned_sampling_trains_the_planners_split_of_the_runs_dp_count(home) -> None:  # type: ignore[no-untyped-def]
    """``sampling=planned``: the run trains, logs and charges the planner's split of its own budget, chosen
    from the DP count of users the run releases (the reason it prints has that count's noise-to-signal, which
    the exact count would change)."""
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.privacy.mechanisms import registry
    from uedp.privacy.mechanisms.auto_sampling import choose_for
    from uedp.services.config import TrainConfig
    from uedp.services.training import train_configuration
    from uedp.storage.catalog import Catalog
    from uedp.storage.ingest import IngestOptions, ingest

    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    config = TrainConfig(dataset="demo", mechanism="userdp", rounds=20, q_user=0.6, local_update="gradient",
                         target_epsilon=8, sampling="planned", checkpoint_every=0, accountant="rdp", threads=1,
                         randomness="seeded")  # a fixed DP count: a secure draw can leave no split (it failed once so)
    said: list[str] = []
    result = train_configuration(home, config, progress=False, report_to=said.append)
    used = result.privacy_extra["population_used"]
    with Catalog(home, "demo") as catalog:
        exact = len({user for _, user, _ in catalog.sentences("train")})
    assert used != exact
    plan = registry.get("userdp").quote
    chosen, choice = choose_for(plan, config.params, Population(used, "dp-count", 10.0), rank_accountant="rdp")
    assert any(line.endswith(f"sampling planned: {choice.reason}") for line in said), said
    _, from_exact = choose_for(plan, config.params, Population(float(exact), "dp-count", 10.0), rank_accountant="rdp")
    assert from_exact.reason != choice.reason  # the line could tell which count it read
    assert (result.settings["q_user"], result.settings["rounds"], result.rounds) == (chosen.q_user, chosen.rounds,
                                                                                      chosen.rounds)
    assert (chosen.q_user, chosen.rounds) != (0.6, 20) and result.epsilon <= 8 + 1e-6
    with pytest.raises(ValueError, match="give target_epsilon"):
        UserDpParams(sampling="planned", noise_multiplier=1.0)
    # a budget with no split is refused without quoting the DP count (drawn, but charged to no run)
    from uedp.errors import UedpError

    small = config.model_copy(update={"params": config.params.model_copy(update={"rounds": 10, "q_user": 0.1})})
    with pytest.raises(UedpError, match="no split of this configuration's budget") as refused:
        train_configuration(home, small, progress=False)
    assert f"{used:,.0f}" not in str(refused.value) and f"{used:.0f}" not in str(refused.value)
