"""Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021) for userdp and uedp-bounded.

The accounting: a round's update (noise z_Delta C_t) and its count of users within the clip (centred
bits, sensitivity 1/2, noise sigma_b) are together one Gaussian of noise multiplier z, with
z^-2 = z_Delta^-2 + (2 sigma_b)^-2. Checked against dp_accounting: without sampling by its PLD and RDP
accountants on the composed pair; with Poisson sampling by its RDP accountant (which reduces the pair
itself), and, since its PLD accountant does not take a sampled pair, by the hockey-stick divergence of the
two-dimensional sampled Gaussian pair integrated on a grid, against dp_accounting's one-dimensional figure
at z (with a control: bits that are not centred, accounted at 1/2, exceed it). Both local trainers count
the users within the round's clip. Then real tiny runs: the clip moves toward the users' median update norm from far above and far below, the run's epsilon is the
round event's at z, the update's noise is z_Delta C, a resume restores the clip, the count's noise comes
from the round's secret stream, and the refusals."""

from __future__ import annotations

import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.pld import privacy_loss_mechanism as plm
from pydantic import ValidationError
from scipy import stats
from torch.nn.utils import parameters_to_vector
from typer.testing import CliRunner

from uedp.cli import app
from uedp.models.metrics import causal_lm_loss
from uedp.privacy.accounting.events import delta_noise_multiplier, group_replace_round, poisson_gaussian_round
from uedp.privacy.mechanisms.base import RoundReport, TrainData
from uedp.privacy.mechanisms.checkpoint import Checkpointer
from uedp.privacy.mechanisms.fedavg import LocalTrainer
from uedp.privacy.mechanisms.params import UeDpBoundedParams, UeDpParams
from uedp.privacy.mechanisms.uedp_bounded import UeDpBounded
from uedp.privacy.mechanisms.userdp import UserDp, UserDpParams
from uedp.privacy.mechanisms.vectorized import VectorizedLocalTrainer
from uedp.privacy.population import Population
from uedp.privacy.primitives import flatten
from uedp.privacy.randomness import Randomness

from support import fedavg_data, tiny_gpt2

CPU = torch.device("cpu")
ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE = dp_accounting.NeighboringRelation.REPLACE_ONE
Z, Z_BIT = 1.0, 2.0  # the round's z and the count's noise multiplier sigma_b / (1/2)
Z_DELTA = delta_noise_multiplier(Z, Z_BIT)
# Real runs: more noise, so uedp-bounded's group accounting (PLD, replace-one) plans in a second or two.
RUN_Z, RUN_SIGMA_B = 2.0, 2.0
RUN_Z_DELTA = delta_noise_multiplier(RUN_Z, RUN_SIGMA_B / 0.5)


# --- the reduction, against dp_accounting ------------------------------------------------------------------


def test_the_reduction_solves_the_joint_noise_multiplier() -> None:
    assert pytest.approx((1 - 1 / 4) ** -0.5) == Z_DELTA
    assert pytest.approx(Z, rel=1e-12) == (Z_DELTA ** -2 + Z_BIT ** -2) ** -0.5
    assert delta_noise_multiplier(1.0, 1e6) == pytest.approx(1.0, rel=1e-9)  # a silent count costs nothing
    with pytest.raises(ValueError, match="must exceed"):
        delta_noise_multiplier(2.0, 2.0)


def _epsilon(relation: dp_accounting.NeighboringRelation, kind: str, event: dp_accounting.DpEvent, rounds: int,
             delta: float = 1e-5) -> float:
    accountant = (dp_accounting.pld.PLDAccountant(relation) if kind == "pld"
                  else dp_accounting.rdp.RdpAccountant(neighboring_relation=relation))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    return float(accountant.get_epsilon(delta))


@pytest.mark.parametrize(("kind", "relation", "rel"), [("pld", ADD_REMOVE, 2e-3), ("pld", REPLACE, 2e-3),
                                                       ("rdp", ADD_REMOVE, 1e-9)])
def test_without_sampling_the_pair_composed_is_one_gaussian_at_z(kind: str, relation: dp_accounting.NeighboringRelation,
                                                                   rel: float) -> None:
    """PLD discretises each Gaussian on its own (pessimistically), so the pair differs by its grid only."""
    pair = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(Z_DELTA), dp_accounting.GaussianDpEvent(Z_BIT)])
    for rounds in (1, 10):
        joint = _epsilon(relation, kind, dp_accounting.GaussianDpEvent(Z), rounds)
        assert _epsilon(relation, kind, pair, rounds) == pytest.approx(joint, rel=rel)
        assert _epsilon(relation, kind, dp_accounting.GaussianDpEvent(Z_DELTA), rounds) < 0.9 * joint  # the count costs


def test_with_sampling_rdp_reduces_the_pair_itself_and_pld_does_not_take_it() -> None:
    q = 0.05
    pair = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(Z_DELTA), dp_accounting.GaussianDpEvent(Z_BIT)]))
    assert _epsilon(ADD_REMOVE, "rdp", pair, 200) == pytest.approx(
        _epsilon(ADD_REMOVE, "rdp", poisson_gaussian_round(q, Z), 200), rel=1e-12)
    # Hence the numeric check below: should dp_accounting's PLD learn this event, compare it here instead.
    assert not dp_accounting.pld.PLDAccountant(ADD_REMOVE).supports(pair)


def _hockey_stick_2d(epsilon: float, q: float, x: tuple[float, float], x_prime: tuple[float, float] | None) -> float:
    """delta(epsilon) of the sampled Gaussian pair in two dimensions, noise N(0, I), by a grid sum over
    [-10, 10]^2 (no reduction to the mean direction assumed): P = (1 - q) N(0) + q N(x) against
    Q = N(0) (add/remove, ``x_prime`` None) or (1 - q) N(0) + q N(x') (replace-one); both orders, the larger."""
    step = 0.01
    grid = np.arange(-10.0, 10.0 + step / 2, step)

    def density(mean: tuple[float, float] | None) -> np.ndarray:
        base = np.outer(stats.norm.pdf(grid), stats.norm.pdf(grid))
        if mean is None:
            return base
        return (1 - q) * base + q * np.outer(stats.norm.pdf(grid - mean[0]), stats.norm.pdf(grid - mean[1]))

    p, p_prime = density(x), density(x_prime)
    factor = math.exp(epsilon)
    return float(max(np.maximum(p - factor * p_prime, 0).sum(), np.maximum(p_prime - factor * p, 0).sum()) * step ** 2)


def _dp_accounting_delta(epsilon: float, q: float, replace: bool) -> float:
    """dp_accounting's exact delta(epsilon) of one sampled Gaussian round at noise multiplier Z."""
    kinds = [plm.AdjacencyType.REPLACE] if replace else [plm.AdjacencyType.ADD, plm.AdjacencyType.REMOVE]
    return max(float(plm.GaussianPrivacyLoss(Z, sampling_prob=q, adjacency_type=kind).get_delta_for_epsilon(epsilon))
               for kind in kinds)


@pytest.mark.parametrize("epsilon", [0.25, 1.0])
def test_with_sampling_the_two_dimensional_pair_has_the_privacy_curve_of_one_gaussian_at_z(epsilon: float) -> None:
    """Coordinates divided by each query's noise std: a user adds (clipped delta / (z_Delta C), (b - 1/2) / sigma_b).
    The extreme users: a clipped delta of norm C (its bit 0: -1/2) and, under replace-one, one of norm C the
    other way (bit 1: +1/2)."""
    q, delta_part, bit_part = 0.3, 1 / Z_DELTA, 1 / Z_BIT  # (1/2) / sigma_b = 1 / Z_BIT
    add_remove = _dp_accounting_delta(epsilon, q, replace=False)
    for bit in (-bit_part, bit_part):
        assert _hockey_stick_2d(epsilon, q, (delta_part, bit), None) == pytest.approx(add_remove, rel=2e-3)
    replace = _dp_accounting_delta(epsilon, q, replace=True)
    assert _hockey_stick_2d(epsilon, q, (delta_part, -bit_part), (-delta_part, bit_part)) == pytest.approx(
        replace, rel=2e-3)
    # Other users of the same bounds move less: both clipped the other way, or a bit flip alone.
    assert _hockey_stick_2d(epsilon, q, (delta_part, -bit_part), (-delta_part, -bit_part)) < replace
    assert _hockey_stick_2d(epsilon, q, (0.2 * delta_part, -bit_part), (0.2 * delta_part, bit_part)) < replace
    # Control: bits not centred (0 or 1) but accounted at sensitivity 1/2 would exceed it (a bit of 1 lies 1 from 0).
    assert _hockey_stick_2d(epsilon, q, (delta_part, 2 * bit_part), None) > 1.1 * add_remove
    assert _hockey_stick_2d(epsilon, q, (delta_part, 0.0), (-delta_part, 2 * bit_part)) > 1.1 * replace


# --- real runs ---------------------------------------------------------------------------------------------


def test_both_trainers_count_the_users_within_the_rounds_clip() -> None:
    """The count is of unclipped norms <= the clip passed for the round (not the trainer's own), and a user
    with nothing to train on (a zero delta) is within it."""
    data = fedavg_data(users=6)
    users = [*data.by_user.values(), []]
    model = tiny_gpt2()
    theta = flatten([p for p in model.parameters() if p.requires_grad])
    root = Randomness.seeded(4)

    def streams() -> list[np.random.Generator]:
        return [root.stream("local-batches", 1, i) for i in range(len(users))]

    args = (model, causal_lm_loss, CPU, data.pad_id, 1e-6, 2, 4, 0.5)  # the trainers' own clip: far below
    sequential = LocalTrainer(*args)
    norms = [float(sequential.local_delta(theta, seqs, s).norm()) for seqs, s in zip(users[:-1], streams())]
    clip = float(np.median(norms))
    expected = sum(n <= clip for n in norms) + 1
    assert expected == 4
    for trainer in (sequential, VectorizedLocalTrainer(*args, group_size=4)):
        summed = trainer.clipped_sum_with_count(theta, users, [1.0] * len(users), streams(), clip)
        assert summed.within_clip == expected
        assert float(summed.total.norm()) <= clip * len(norms) * (1 + 1e-5)


def _adaptive(**overrides: object) -> dict[str, object]:
    """Adaptive clipping on a tiny run whose weights barely move (server_lr), so the users' norms stay put."""
    return {"rounds": 10, "q_user": 1.0, "noise_multiplier": RUN_Z, "quantile_noise": RUN_SIGMA_B, "adaptive_clip": True,
            "clip_lr": 1.0, "local_steps": 2, "local_batch_size": 4, "server_lr": 1e-3, "accountant": "pld",
            **overrides}


def _bounded_data() -> TrainData:
    data = fedavg_data()
    entities = {u: [frozenset({"LOC:leeds"}) if i == 0 else frozenset() for i in range(len(s))]
                for u, s in data.by_user.items()}
    return TrainData(data.by_user, data.pad_id, entities)


def _userdp(randomness: Randomness, **overrides: object) -> UserDp:
    return UserDp(UserDpParams(**_adaptive(**overrides)), Population.declared(12), randomness)  # type: ignore[arg-type]


def _bounded(randomness: Randomness, **overrides: object) -> UeDpBounded:
    return UeDpBounded(UeDpBoundedParams(holders_per_entity=2, **_adaptive(**overrides)), randomness)  # type: ignore[arg-type]


def _train(mechanism: UserDp, data: TrainData, model: torch.nn.Module | None = None,
           checkpoint: Checkpointer | None = None, crash_at: int | None = None):  # type: ignore[no-untyped-def]
    reports: list[RoundReport] = []

    def on_round(report: RoundReport) -> None:
        reports.append(report)
        if report.round == crash_at:
            raise RuntimeError("crash")

    kwargs = {"checkpoint": checkpoint} if checkpoint else {}
    return mechanism.train(model or tiny_gpt2(), data, causal_lm_loss, CPU, on_round, **kwargs).statement, reports


def _median_norm(data: TrainData, params: UserDpParams) -> float:
    model = tiny_gpt2()
    trainer = LocalTrainer(model, causal_lm_loss, CPU, data.pad_id, 1.0, params.local_steps, params.local_batch_size,
                           params.local_lr)
    theta = flatten([p for p in model.parameters() if p.requires_grad])
    root = Randomness.seeded(0)
    return float(np.median([float(trainer.local_delta(theta, seqs, root.stream("local-batches", 1, u)).norm())
                            for u, seqs in data.by_user.items()]))


@pytest.mark.parametrize("mechanism", ["userdp", "uedp-bounded"])
def test_the_clip_moves_to_the_median_update_norm_from_far_above_and_far_below(mechanism: str) -> None:
    data = _bounded_data()
    build = _userdp if mechanism == "userdp" else _bounded
    median = _median_norm(data, UserDpParams(**_adaptive()))  # type: ignore[arg-type]
    high, _ = _train(build(Randomness.seeded(1), clip=100.0), data)
    low, _ = _train(build(Randomness.seeded(1), clip=1e-4, clip_lr=2.0), data)
    for statement in (high, low):
        assert median / 3 < statement.extra["clip_final"] < 3 * median  # within a step or two of it
        assert "adaptive clipping" in statement.notes and "public" in statement.notes
    assert high.extra["clip_start"] == 100.0 and low.extra["clip_start"] == 1e-4
    # A fixed clip stays where it was put: the movement is adaptive clipping's.
    fixed, _ = _train(build(Randomness.seeded(1), clip=100.0, adaptive_clip=False, rounds=1), data)
    assert "clip_final" not in fixed.extra and "adaptive" not in fixed.notes


def test_the_statements_epsilon_is_dp_accountings_for_the_round_event_at_z() -> None:
    """Both mechanisms: adaptive clipping spends nothing beyond the stated z (the count is inside it)."""
    rounds, q = 3, 0.5
    userdp, reports = _train(_userdp(Randomness.seeded(2), rounds=rounds, q_user=q), _bounded_data())
    direct = dp_accounting.pld.PLDAccountant(ADD_REMOVE)
    direct.compose(dp_accounting.SelfComposedDpEvent(poisson_gaussian_round(q, RUN_Z), rounds))
    assert userdp.epsilon == reports[-1].epsilon == pytest.approx(direct.get_epsilon(1e-5), rel=1e-6)
    assert userdp.noise_multiplier == RUN_Z and userdp.extra["update_noise_multiplier"] == pytest.approx(RUN_Z_DELTA)
    bounded, _ = _train(_bounded(Randomness.seeded(2), rounds=rounds, q_user=q), _bounded_data())
    direct = dp_accounting.pld.PLDAccountant(REPLACE)
    direct.compose(dp_accounting.SelfComposedDpEvent(group_replace_round(q, RUN_Z, 3), rounds))
    assert bounded.epsilon == pytest.approx(direct.get_epsilon(1e-5), rel=1e-6)
    # and a fixed clip with the same z reports the same figure
    fixed, _ = _train(_bounded(Randomness.seeded(2), rounds=rounds, q_user=q, adaptive_clip=False), _bounded_data())
    assert bounded.epsilon == fixed.epsilon


def test_the_updates_noise_has_standard_deviation_z_delta_times_the_clip() -> None:
    # local_lr = 0: every delta is zero, so the one round's update is noise * server_lr / (q N).
    clip, q = 0.3, 1.0
    model = tiny_gpt2()
    before = parameters_to_vector(model.parameters()).detach().clone()
    _train(_userdp(Randomness.secure(), rounds=1, clip=clip, local_lr=0.0, server_lr=1.0), fedavg_data(), model)
    noise = (parameters_to_vector(model.parameters()).detach() - before) * q * 12
    n = noise.numel()
    chi = float((noise.double() ** 2).sum()) / (RUN_Z_DELTA * clip) ** 2
    assert stats.chi2.ppf(1e-6, n) <= chi <= stats.chi2.ppf(1 - 1e-6, n)  # z * clip alone would fail: 1.15^2 off


def _expected_clips(root: Randomness, start: float, params: UserDpParams, users: int) -> float:
    """The clip after ``params.rounds`` rounds when every user is within the clip (zero deltas), recomputed
    from the run's "clip-noise" streams alone."""
    clip, sigma_b = start, params.quantile_noise
    assert sigma_b is not None
    for round_index in range(1, params.rounds + 1):
        noise = root.stream("clip-noise", round_index).standard_normal(1, dtype=np.float64)[0] * sigma_b
        share = min(1.0, max(0.0, 0.5 + (users / 2 + noise) / (params.q_user * users)))
        clip *= math.exp(-params.clip_lr * (share - params.target_quantile))
    return clip


def test_the_counts_noise_comes_from_the_rounds_secret_stream() -> None:
    """Zero deltas (local_lr = 0) and q = 1: every user is within the clip, so the count's noise is the
    clip's only randomness. Same seed, same clips; secure roots differ even with torch's generator reset."""
    overrides = {"rounds": 4, "local_lr": 0.0, "quantile_noise": 3.0, "target_quantile": 0.9}
    seeded = [_train(_userdp(Randomness.seeded(5), **overrides), fedavg_data())[0].extra["clip_final"] for _ in "ab"]
    assert seeded[0] == seeded[1]
    params = UserDpParams(**_adaptive(**overrides))  # type: ignore[arg-type]
    assert seeded[0] == pytest.approx(_expected_clips(Randomness.seeded(5), 1.0, params, 12), rel=1e-12)
    assert seeded[0] != pytest.approx(_expected_clips(Randomness.seeded(6), 1.0, params, 12), rel=1e-6)
    secure = []
    for _ in "ab":
        torch.manual_seed(0)
        secure.append(_train(_userdp(Randomness.secure(), **overrides), fedavg_data())[0].extra["clip_final"])
    assert secure[0] != secure[1]


def test_a_resumed_run_goes_on_with_the_clip_it_had(tmp_path: Path) -> None:
    data = fedavg_data()
    whole, _ = _train(_userdp(Randomness.seeded(3), clip=100.0, rounds=6), data)
    checkpoint = Checkpointer(tmp_path, every=2, fingerprint="adaptive")
    with pytest.raises(RuntimeError, match="crash"):
        _train(_userdp(Randomness.seeded(3), clip=100.0, rounds=6), data, checkpoint=checkpoint, crash_at=5)
    resumed, reports = _train(_userdp(Randomness.seeded(3), clip=100.0, rounds=6), data, checkpoint=checkpoint)
    assert reports[0].round == 5  # from the checkpoint of round 4, whose clip is far below 100 by then
    assert resumed.extra["clip_final"] == pytest.approx(whole.extra["clip_final"], rel=1e-9)
    assert resumed.extra["clip_final"] < 10


# --- refusals and the planner ------------------------------------------------------------------------------


def test_uedp_refuses_adaptive_clipping() -> None:
    with pytest.raises(ValidationError, match="uedp does not adapt its clip"):
        UeDpParams(adaptive_clip=True)


def test_a_count_noise_that_leaves_no_room_for_the_update_is_refused_naming_the_options() -> None:
    # Default sigma_b = q N / 20 = 0.3 for 12 users at q = 0.5: over 1/2 that is 0.6 < z = 2.
    mechanism = UserDp(UserDpParams(**_adaptive(q_user=0.5, quantile_noise=None)), Population.declared(12))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"quantile_noise 0\.3 .* must exceed the noise multiplier z = 2") as refused:
        _train(mechanism, fedavg_data())
    assert all(option in str(refused.value) for option in ("noise_multiplier", "target_epsilon", "adaptive_clip"))
    with pytest.raises(ValueError, match="must exceed"):  # 1 / (1/2) = 2 = z: not above it
        _train(_bounded(Randomness.seeded(0), quantile_noise=1.0), _bounded_data())


def test_the_planner_shows_adaptive_clipping_with_z_delta_and_sigma_b() -> None:
    result = CliRunner().invoke(app, ["epsilon", "--mechanism", "userdp", "--users", "946", "--q-user", "0.05",
                                      "--rounds", "20", "--noise-multiplier", "1.0", "--adaptive-clip"])
    assert result.exit_code == 0, result.output
    sigma_b = 0.05 * 946 / 20
    assert "adaptive clipping" in result.output and f"sigma_b = {sigma_b:.4g}" in result.output
    assert f"z_Delta = {delta_noise_multiplier(1.0, 2 * sigma_b):.4g}" in result.output
    fixed = CliRunner().invoke(app, ["epsilon", "--mechanism", "userdp", "--users", "946", "--noise-multiplier", "1.0"])
    assert fixed.exit_code == 0 and "adaptive" not in fixed.output
    refused = CliRunner().invoke(app, ["epsilon", "--mechanism", "uedp-bounded", "--users", "40", "--q-user", "0.05",
                                       "--noise-multiplier", "2.0", "--holders-per-entity", "2", "--adaptive-clip"])
    assert refused.exit_code != 0 and "quantile_noise" in refused.output
