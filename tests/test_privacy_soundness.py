"""Every reported epsilon describes what is released (issue: secret randomness, nothing private beside the
model, one random stream per unit). One test per finding of the adversarial review; each fails on the
code the review found (seeded noise by default, exact-count denominators and logs, one shared local
stream, entity-dependent uedp weights, per-rank secure roots, raw canary hosts)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mlflow.tracking import MlflowClient
from scipy import stats
from torch.nn.utils import parameters_to_vector

from uedp.detection.pipeline import DetectorConfig
from uedp.flows.demo import DEMO_CORPUS
from uedp.models.batching import encode
from uedp.models.metrics import causal_lm_loss
from uedp.privacy.accounting.events import epsilon_after, poisson_gaussian_round
from uedp.privacy.mechanisms.base import TrainData
from uedp.privacy.mechanisms.fedavg import LocalTrainer
from uedp.privacy.mechanisms.uedp import UeDp, UeDpParams, usable_sequences
from uedp.privacy.mechanisms.userdp import UserDp, UserDpParams
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness
from uedp.services.config import TrainConfig
from uedp.services.detect import detect_entities
from uedp.services.training import train_configuration
from uedp.storage.catalog import Catalog
from uedp.storage.ingest import IngestOptions, ingest

from support import TOKENIZER
from support import fedavg_data as _data
from support import tiny_gpt2 as _model

CPU = torch.device("cpu")


@pytest.fixture
def demo(home) -> str:
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    return "demo"


# 1. Noise is not reproducible from what is logged ------------------------------------------------------


def test_two_default_private_runs_release_different_models_and_a_seeded_run_says_so(home, demo: str) -> None:
    config = TrainConfig(dataset=demo, mechanism="userdp", steps=2, q_user=0.5, local_steps=1, checkpoint_every=0)
    assert config.randomness == "secure"  # the default for every private mechanism
    first, second = (train_configuration(home, config, progress=False) for _ in range(2))
    assert first.utility_test != second.utility_test  # other noise: the logged seed does not determine it
    client = MlflowClient(tracking_uri=home.mlflow_tracking_uri)
    secure = client.get_run(first.run_id)
    assert secure.data.tags["uedp.randomness"] == "secure" and "uedp.guarantee" not in secure.data.tags

    seeded_config = config.model_copy(update={"randomness": "seeded"})
    seeded = [train_configuration(home, seeded_config, progress=False) for _ in range(2)]
    assert seeded[0].utility_test == seeded[1].utility_test  # reproducible, and therefore...
    run = client.get_run(seeded[0].run_id)
    assert run.data.tags["uedp.randomness"] == "seeded" and "knows the seed" in run.data.tags["uedp.guarantee"]
    assert "does not hold against anyone who knows" in run.data.params["privacy_caveats"]


def test_secret_streams_are_not_enumerable() -> None:
    """torch's CPU generator keeps only the low 32 bits of a seed: 2^32 tries would find a run's noise.
    Streams are numpy PCG64DXSM generators seeded with a 256-bit keyed digest instead."""
    assert torch.equal(torch.randn(3, generator=torch.Generator().manual_seed(5)),
                       torch.randn(3, generator=torch.Generator().manual_seed(5 + 2**32)))  # the trap
    stream = Randomness.secure().stream("noise", 1)
    assert isinstance(stream.bit_generator, np.random.PCG64DXSM)
    assert stream.bit_generator.seed_seq.entropy.bit_length() > 128
    assert Randomness.seeded(1).stream("noise", 1).random() != Randomness.seeded(1).stream("noise", 2).random()


def test_secure_noise_is_not_the_noise_of_the_logged_seed() -> None:
    """The review's attack: regenerate the noise from the logged seed and subtract it. With local_lr = 0 the
    update is noise only; the seed's noise does not match it in secure mode, and matches exactly seeded."""
    params = UserDpParams(rounds=1, q_user=1.0, noise_multiplier=1.0, clip=1.0, local_lr=0.0, local_steps=1)
    for randomness, recomputable in ((Randomness.secure(), False), (Randomness.seeded(0), True)):
        model = _model()
        before = parameters_to_vector(model.parameters()).detach().clone()
        UserDp(params, Population.declared(12), randomness).train(model, _data(), causal_lm_loss, CPU, lambda r: None)
        update = (parameters_to_vector(model.parameters()).detach() - before) * 12
        guess = torch.from_numpy(Randomness.seeded(0).stream("noise", 1).standard_normal(update.numel(), dtype=np.float32))
        assert torch.allclose(update, guess, atol=1e-4) is recomputable


# 2. A fixed denominator, and M from a public or DP bound ---------------------------------------------


def test_the_update_scale_does_not_reveal_the_number_of_users() -> None:
    """D has 20 users, D' 21. With the count declared public (or DP), the noise's scale in the released
    update is the same for both; dividing by the exact count made it 20 vs 21, run after run."""
    params = UserDpParams(rounds=1, q_user=1.0, noise_multiplier=1.0, clip=1.0, local_lr=0.0, local_steps=1)
    for users in (20, 21):
        mechanism = UserDp(params, Population.declared(20), Randomness.secure())
        model = _model()
        before = parameters_to_vector(model.parameters()).detach().clone()
        mechanism.train(model, _data(users=users, per_user=1), causal_lm_loss, CPU, lambda r: None)
        update = (parameters_to_vector(model.parameters()).detach() - before).double()
        estimated_denominator = 1.0 / float(update.std())  # noise std is z * clip = 1
        assert estimated_denominator == pytest.approx(20.0, rel=0.01)


def test_the_default_count_is_a_dp_count_composed_into_epsilon(home, demo: str) -> None:
    config = TrainConfig(dataset=demo, mechanism="userdp", steps=2, q_user=0.5, local_steps=1, checkpoint_every=0,
                         accountant="rdp")
    result = train_configuration(home, config, progress=False)
    with Catalog(home, demo) as catalog:
        exact = len({user for _, user, _ in catalog.sentences("train")})
    used = result.privacy_extra["population_used"]
    assert used != exact and abs(used - exact) < 8 * 10.0  # noised, with std 10
    without_count = epsilon_after(poisson_gaussian_round(0.5, 1.0), 2, 1e-5, "rdp")
    with_count = epsilon_after(poisson_gaussian_round(0.5, 1.0), 2, 1e-5, "rdp", initial=Population(1, "dp-count", 10).event())
    assert result.epsilon == pytest.approx(with_count) and with_count > without_count
    assert any("DP count" in line for line in result.public)


def test_uedp_bounds_m_from_the_dp_count_not_the_exact_one() -> None:
    population = Population(40.0, "dp-count", 10.0)
    mechanism = UeDp(UeDpParams(rounds=30, q_user=0.5, noise_multiplier=1.0), population, Randomness.secure())
    plan = mechanism.accounting
    # Its failure costs delta_bound (1 + e^epsilon): 0.1 delta (tests/test_second_audit.py, item 5).
    assert plan.delta_bound * (1 + math.exp(plan.epsilon_bound)) == pytest.approx(1e-6)
    assert plan.n_users_bound == population.upper_bound(plan.delta_bound) > 40
    assert plan.delta_accountant == pytest.approx(1e-5 - 1e-6 - 1e-6)
    # the bound holds except with probability delta_bound
    assert stats.norm.sf((plan.n_users_bound - 40.0) / 10.0) <= plan.delta_bound


# 3. Nothing logged depends on private data beyond rule 4 ---------------------------------------------


FORBIDDEN = ("n_train_users", "n_train_sentences", "privacy_entities_E", "privacy_extended_S", "participants",
             "privacy_rounds_truncated", "uedp.dataset_key", "uedp.entities_key")


@pytest.mark.parametrize("mechanism", ["dpsgd", "selective", "userdp", "uedp", "uedp-naive", "uedp-bounded"])
def test_an_mlflow_run_read_back_holds_no_exact_count_of_private_data(home, demo: str, mechanism: str) -> None:
    # One set of settings for every mechanism; each takes the ones it knows.
    config = TrainConfig.for_mechanism(mechanism, dataset=demo, steps=2, public_steps=2, q_user=0.5, local_steps=1,
                                       batch_size=4, checkpoint_every=0, canaries=1)
    result = train_configuration(home, config, progress=False)
    client = MlflowClient(tracking_uri=home.mlflow_tracking_uri)
    run = client.get_run(result.run_id)
    with Catalog(home, demo) as catalog:
        train = catalog.sentences("train")
        totals = catalog.totals(list(config.categories))
        counts = {c.entities for c in catalog.category_counts(list(config.categories))}
    planted = config.canaries * config.canary_repeats  # canaries are training sequences too
    exact = {len(train), len(train) + planted, len({u for _, u, _ in train}), *totals.values(), *counts} - {0, 1, 2}
    names = {*run.data.params, *run.data.metrics, *run.data.tags}
    assert not names & set(FORBIDDEN) and not any(n.startswith(("entities_", "users_with_")) for n in names)
    with tempfile.TemporaryDirectory() as tmp:  # the statement artifact, numbers included
        resolved = json.loads(Path(client.download_artifacts(run.info.run_id, "resolved_config.json", tmp)).read_text())
    released = {**run.data.params, **{k: str(v) for k, v in run.data.metrics.items()},
                **{f"artifact:{k}": str(v) for k, v in resolved["privacy"].items() if not isinstance(v, (dict, list))},
                **{f"artifact:extra.{k}": str(v) for k, v in resolved["privacy"]["extra"].items()}}
    allowed = set(TrainConfig.model_fields) | {"model_parameters", "processes", "rounds_run", "resumed_from_round",
                                               "artifact:rounds"}
    if mechanism == "selective":  # replace-one neighbours have as many sequences: their count is public
        assert "public under replace-one" in run.data.params["privacy_public"]
        allowed |= {"privacy_population_used", "artifact:extra.population_used"}
    if mechanism == "uedp-bounded":  # substitution: the user count is public; the graph is declared public
        assert "public under replace-one" in run.data.params["privacy_public"]
        assert "attribution graph" in run.data.params["privacy_public"]
        graph_figures = ("population_used", "sensitive_sentences", "sensitive_sentences_kept", "sentences_without_entity",
                         "group_size", "holders_per_entity")  # the last two: 1 + k and k, given or chosen by auto from the public graph
        allowed |= {f"{prefix}{name}" for name in graph_figures for prefix in ("privacy_", "artifact:extra.")}
    for key, value in released.items():
        if key in allowed:
            continue  # set by the user or the model, or public by the adjacency
        try:
            number = float(value)
        except ValueError:
            continue
        assert number not in exact, f"{key}={value} equals an exact count of private data"
    assert run.data.params["privacy_randomness"] == "secure"
    assert "held-out users' text" in run.data.params["privacy_caveats"]
    if mechanism in ("selective", "uedp", "uedp-naive", "uedp-bounded"):
        assert "not protected as entities" in run.data.params["privacy_caveats"]
    history = [m.step for m in client.get_metric_history(run.info.run_id, "epsilon")]
    assert history and not client.get_metric_history(run.info.run_id, "participants")
    # 9. the canary artifact names its host by a keyed pseudonym, never by the raw user id
    with tempfile.TemporaryDirectory() as tmp:
        canaries = json.loads(Path(client.download_artifacts(run.info.run_id, "canaries.json", tmp)).read_text())
    raw_users = {u for _, u, _ in train}
    assert canaries and all(c["user"].startswith("user-") and c["user"] not in raw_users for c in canaries)


def test_a_declared_count_below_the_true_one_is_refused_before_anything_is_logged(home, demo: str) -> None:
    """uedp bounds its sampled users from a declared count: one below the truth would undercount epsilon."""
    from uedp.errors import UedpError

    config = TrainConfig(dataset=demo, mechanism="uedp", steps=1, q_user=0.5, local_steps=1, checkpoint_every=0,
                         public_count=3)
    with pytest.raises(UedpError, match="--public-count 3 is below the number of privacy units"):
        train_configuration(home, config, progress=False)
    client = MlflowClient(tracking_uri=home.mlflow_tracking_uri)
    assert client.get_experiment_by_name(demo) is None or not client.search_runs(
        [client.get_experiment_by_name(demo).experiment_id])  # no half-made run
    with Catalog(home, demo) as catalog:
        roster = catalog.roster_size("train")
    ok = train_configuration(home, config.model_copy(update={"public_count": roster}), progress=False)
    assert ok.privacy_extra["population_used"] == roster and any("declared public" in p for p in ok.public)


# 4. One independent local stream per (round, unit) ----------------------------------------------------


def test_adding_a_unit_changes_no_other_units_sampling_coin() -> None:
    randomness = Randomness.secure()
    units = [f"u{i}" for i in range(300)]
    before = set(randomness.poisson_sample("sample-users", 3, units, 0.3))
    after = randomness.poisson_sample("sample-users", 3, ["u-new", *units], 0.3)
    assert {i - 1 for i in after if i > 0} == before  # the same users, whatever their position
    kept = randomness.keep_at_most("truncate-users", 3, units, 50)
    kept_with_new = randomness.keep_at_most("truncate-users", 3, ["u-new", *units], 50)
    assert len({i - 1 for i in kept_with_new if i > 0} - set(kept)) == 0  # survivors never reshuffled


def test_uedp_s_case_adjacency_moves_the_sum_by_at_most_three_beta_with_real_streams() -> None:
    """D' = D + user u' + one extended-entity sentence of user v (the first user, so that a shared stream
    would reorder every later user's batches): at most beta through u' plus 2 beta through v."""
    clip = 0.02
    root = Randomness.secure()
    theta = parameters_to_vector(_model().parameters()).detach().clone()

    def users(extra_sentence: bool, new_user: bool) -> TrainData:
        texts = {f"u{u}": [f"plain note {i} of user {u} about the weather and the tides" for i in range(4)]
                 for u in range(6)}
        if extra_sentence:
            texts["u0"] = [*texts["u0"], "an added private sentence with no entity at all, long enough to matter"]
        if new_user:
            texts = {"u-new": ["the added user writes something entirely different"] * 3, **texts}
        return TrainData({u: encode(TOKENIZER, t, 64) for u, t in texts.items()}, TOKENIZER.pad_token_id,
                         {u: [frozenset()] * len(t) for u, t in texts.items()})

    def clipped_sum(data: TrainData) -> torch.Tensor:
        trainer = LocalTrainer(_model(), causal_lm_loss, CPU, data.pad_id, clip, 4, 2, 0.5)
        groups = [[seqs[i] for i in usable_sequences(data.entities[u], set(), set(range(len(seqs))), False)]
                  for u, seqs in data.by_user.items()]
        streams = [root.stream("local-batches", 1, u) for u in data.by_user]
        return trainer.clipped_sum(theta, groups, [1.0] * len(groups), streams)

    moved = float(torch.linalg.vector_norm(clipped_sum(users(True, True)) - clipped_sum(users(False, False))))
    assert 0.5 * clip < moved <= 3 * clip * (1 + 1e-5)  # u' alone adds a clipped delta of norm beta


# 5. uedp weights no entity can change ------------------------------------------------------------------


def test_uedp_refuses_weights_an_entity_can_move() -> None:
    with pytest.raises(ValueError, match="weighs every user 1"):
        UeDp(UeDpParams(weight_cap=4.0), Population.declared(10))
    with pytest.raises(ValueError, match="weighs every user 1"):
        TrainConfig(dataset="d", mechanism="uedp", weight_cap=4.0)


# 7. torchrun: rank 0 draws the root, every rank uses it -------------------------------------------------


def _rank(rank: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        randomness = Randomness.secure().shared_across_ranks()  # each rank draws its own; rank 0's wins
        sampled = randomness.poisson_sample("sample-examples", 1, [f"s{i}" for i in range(200)], 0.1)
        noise = randomness.stream("noise", 1).standard_normal(4).tolist()
        Path(out, f"{rank}.json").write_text(json.dumps({"sampled": sampled, "noise": noise}))
    finally:
        dist.destroy_process_group()


def test_torchrun_ranks_share_rank_zeros_secret_root(tmp_path: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_rank, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1] and ranks[0]["sampled"]


# 8. What is not protected is said -----------------------------------------------------------------------


def test_the_cli_prints_what_epsilon_does_not_cover(home, demo: str) -> None:
    from typer.testing import CliRunner

    from uedp.cli import app

    result = CliRunner().invoke(app, ["train", demo, "--home", str(home.root), "--mechanism", "uedp", "--steps", "1",
                                      "--q-user", "0.5", "--local-steps", "1", "--checkpoint-every", "0"])
    assert result.exit_code == 0, result.output
    assert "not covered by epsilon: validation and test metrics" in result.stdout
    assert "not protected as entities" in result.stdout and "docs/PRIVACY.md" in result.stdout
    assert "public: number of units: a DP count" in result.stdout


def test_a_resumed_secure_run_reuses_its_dp_count_and_composes_it_once(home, demo: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from uedp.services.tracking import RunTracker

    config = TrainConfig(dataset=demo, mechanism="userdp", steps=4, checkpoint_every=2, q_user=0.5, local_steps=1,
                         accountant="rdp")
    original = RunTracker.log_metrics

    def crash_at_round_3(self, metrics, step=0):  # type: ignore[no-untyped-def]
        if step == 3 and "epsilon" in metrics:
            raise KeyboardInterrupt
        return original(self, metrics, step)

    monkeypatch.setattr(RunTracker, "log_metrics", crash_at_round_3)
    with pytest.raises(KeyboardInterrupt):
        train_configuration(home, config, progress=False)
    monkeypatch.setattr(RunTracker, "log_metrics", original)
    folder = home.checkpoint_dir(demo, config.fingerprint())
    (name, drawn), = json.loads((folder / "released.json").read_text()).items()
    assert name.startswith("dp_count_of_units/")  # keyed by the dataset: other data, another count
    saved = torch.load(folder / "checkpoint.pt", weights_only=False)
    assert "noise" not in saved["objects"] and "sampling" not in saved["objects"]  # no secret stream is stored

    resumed = train_configuration(home, config, progress=False)
    assert resumed.resumed_from == 2 and resumed.privacy_extra["population_used"] == drawn
    count = Population(drawn, "dp-count", 10.0).event()
    assert resumed.epsilon == pytest.approx(epsilon_after(poisson_gaussian_round(0.5, 1.0), 4, 1e-5, "rdp",
                                                          initial=count))
    assert not (folder / "released.json").exists()  # gone with the finished run's checkpoint
