"""The one-run audit end to end: canaries at each mechanism's unit with secret coins, what flipping one
coin changes in the training data (real data path, real randomness), the participation record against
what a run really sampled, and trained models: a noiseless run and a deliberately broken DP-SGD are
caught, correctly noised DP-SGD and userdp are not."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from uedp.privacy.attacks.audit_canaries import (
    HOST_PREFIX,
    AuditDraw,
    audit_scores,
    draw_audit,
)
from uedp.privacy.attacks.one_run import GUESS_SHARES, audit, audit_best

from support import tiny_gpt2

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The bundled demo corpus, ingested with its gold entities (shared by this module's runs)."""
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.services.detect import detect_entities
    from uedp.storage.home import DataHome
    from uedp.storage.ingest import IngestOptions, ingest

    home = DataHome.from_env(tmp_path_factory.mktemp("audit") / "home")
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    return home


def _users(count: int = 10) -> list[str]:
    return [f"writer{i}" for i in range(count)]


# --- the plan ---------------------------------------------------------------------------------------


def test_coins_are_fair_and_names_never_repeat() -> None:
    plan = draw_audit(2000, "sequence", "add_remove", _users(), np.random.default_rng(0))
    assert 900 < sum(plan.included) < 1100
    names = [c.secret for c in plan.canaries] + [c.decoy for c in plan.canaries]
    assert len(set(names)) == 4000
    assert all(c.hosts == (f"{HOST_PREFIX}{c.index:04d}",) for c in plan.canaries)


def test_each_unit_has_its_shape() -> None:
    rng = np.random.default_rng(1)
    user = draw_audit(4, "user", "add_remove", _users(), rng)
    assert all(len(c.templates) == 4 and len(set(c.hosts)) == 1 and c.own_hosts() for c in user.canaries)
    entity = draw_audit(4, "entity", "add_remove", _users(), rng)
    for canary in entity.canaries:  # one sentence in each of 4 distinct real users
        assert len(canary.hosts) == len(set(canary.hosts)) == 4 and set(canary.hosts) <= set(_users())
    few = draw_audit(3, "entity", "replace", _users(2), rng)
    assert all(sorted(c.hosts) == _users(2) for c in few.canaries)
    assert draw_audit(2, "secret", "replace", _users(), rng).marks_spans


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="named like an audit canary"):
        draw_audit(4, "user", "add_remove", [f"{HOST_PREFIX}0001"], np.random.default_rng(0))
    with pytest.raises(ValueError, match="at least 2"):
        draw_audit(1, "user", "add_remove", _users(), np.random.default_rng(0))
    with pytest.raises(ValueError, match="need training users"):
        draw_audit(4, "entity", "add_remove", [], np.random.default_rng(0))


def test_the_released_design_holds_no_coins_and_no_real_hosts() -> None:
    plan = draw_audit(8, "entity", "replace", _users(), np.random.default_rng(2))
    public = plan.public()
    text = json.dumps(public)
    assert "included" not in text and not any(user in text for user in _users())
    assert [c["hosts"] for c in public["canaries"]] == ["4 training users"] * 8  # type: ignore[index]
    made_up = draw_audit(3, "user", "add_remove", _users(), np.random.default_rng(2)).public()
    assert made_up["canaries"][0]["hosts"] == [f"{HOST_PREFIX}0000"] * 4  # type: ignore[index]
    assert AuditDraw.from_json(plan.to_json()) == plan


def test_a_declared_count_is_checked_against_every_canary_planted() -> None:
    from uedp.services.audit_draw import absent_units

    plan = draw_audit(10, "user", "add_remove", _users(), np.random.default_rng(6))
    tails = 10 - sum(plan.included)
    assert absent_units(plan, "users") == tails and absent_units(plan, "sequences") == 4 * tails
    assert absent_units(replace(plan, included=(True,) * 10), "users") == 0
    assert absent_units(draw_audit(10, "entity", "replace", _users(), np.random.default_rng(6)), "sequences") == 0


def test_tails_remove_the_canary_or_put_the_decoy_in_its_place() -> None:
    rng = np.random.default_rng(3)
    removed = draw_audit(40, "user", "add_remove", _users(), rng)
    placed = {p.canary for p in removed.placements()}
    assert placed == {c.index for c in removed.canaries if removed.included[c.index]}
    swapped = draw_audit(40, "entity", "replace", _users(), rng)
    by_canary: dict[int, list] = {}
    for p in swapped.placements():
        by_canary.setdefault(p.canary, []).append(p)
    assert set(by_canary) == set(range(40))
    for canary in swapped.canaries:
        value = canary.secret if swapped.included[canary.index] else canary.decoy
        got = by_canary[canary.index]
        assert [p.user for p in got] == list(canary.hosts)
        assert all(p.span is not None and p.text[p.span[0]:p.span[1]] == value for p in got)


def test_scores_are_the_secret_likelihood_minus_the_decoys_under_substitution() -> None:
    plan = draw_audit(3, "user", "add_remove", _users(), np.random.default_rng(4))
    nll = {}
    for i, c in enumerate(plan.canaries):
        nll |= {t: 10.0 + i for t in c.texts(c.secret)} | {t: 100.0 for t in c.texts(c.decoy)}
    score = lambda texts: np.array([nll[t] for t in texts])  # noqa: E731
    assert audit_scores(plan, score).tolist() == [-40.0, -44.0, -48.0]
    swapped = replace(plan, adjacency="replace")
    assert audit_scores(swapped, score).tolist() == [360.0, 356.0, 352.0]


def test_the_best_guess_count_is_paid_for_with_bonferroni() -> None:
    rng = np.random.default_rng(5)
    included = rng.random(200) < 0.5
    scores = included * 1.0 + rng.normal(0, 0.8, 200)
    best = audit_best(scores, included, 1e-5)
    counts = sorted({int(s * 200) // 2 for s in GUESS_SHARES})
    singles = [audit(scores, included, k, k, 1e-5, 1 - 0.05 / len(counts)) for k in counts]
    assert best.epsilon_lower_bound == max(a.epsilon_lower_bound for a in singles) > 0
    uncorrected = max(audit(scores, included, k, k, 1e-5).epsilon_lower_bound for k in counts)
    assert best.epsilon_lower_bound < uncorrected
    assert best.confidence == 0.95


# --- the training data ------------------------------------------------------------------------------


def _texts(home, mechanism: str, coins: tuple[bool, ...] | None = None, count: int = 6, **settings):  # type: ignore[no-untyped-def]
    """The training texts a run of ``mechanism`` with audit canaries trains on (the data path training
    uses), with the plan's coins replaced by ``coins`` when given."""
    from uedp.services.audit_draw import draw_for
    from uedp.services.config import TrainConfig
    from uedp.services.training_data import load_training_texts
    from uedp.storage.catalog import Catalog

    config = TrainConfig(dataset="demo", mechanism=mechanism, audit_canaries=count, randomness="seeded", **settings)
    with Catalog(home, "demo") as catalog:
        plan = draw_for(home, config, sorted({u for _, u, _ in catalog.sentences("train")}))
        plan = replace(plan, included=coins) if coins is not None else plan
        return plan, load_training_texts(catalog, config, plan)


def _sentences(texts: dict[str, list[str]]) -> set[tuple[str, str]]:
    return {(u, t) for u, ts in texts.items() for t in ts}


@pytest.mark.parametrize(("mechanism", "unit"), [("dpsgd", "sequence"), ("userdp", "user"), ("uedp", "entity")])
def test_one_coin_adds_exactly_one_unit_under_add_remove(demo_home, mechanism: str, unit: str) -> None:
    plan, _ = _texts(demo_home, mechanism)
    assert plan.unit == unit and plan.adjacency == "add_remove"
    heads = tuple(i == 2 for i in range(6))
    _, without = _texts(demo_home, mechanism, (False,) * 6)
    _, with_one = _texts(demo_home, mechanism, heads)
    added = _sentences(with_one.texts) - _sentences(without.texts)
    assert not _sentences(without.texts) - _sentences(with_one.texts)
    canary = plan.canaries[2]
    assert added == set(zip(canary.hosts, canary.texts(canary.secret)))
    if unit == "user":  # one new user, holding all of the canary's sentences
        assert set(with_one.texts) - set(without.texts) == {canary.hosts[0]}
    if unit == "entity":  # the canary is an entity of each of its sentences, in several users
        from uedp.services.audit_draw import canary_key

        marked = [(u, i) for u, sets in with_one.entities.items() for i, s in enumerate(sets)
                  if canary_key(canary.secret) in s]
        assert len({u for u, _ in marked}) == len(canary.hosts) >= 2


def test_a_coin_under_substitution_changes_texts_not_the_attribution_graph(demo_home) -> None:
    from uedp.privacy.attribution import AttributionGraph, choose_holders

    plan, heads = _texts(demo_home, "uedp-bounded", (True,) * 6)
    _, tails = _texts(demo_home, "uedp-bounded", (True,) * 5 + (False,))
    graphs = [AttributionGraph.from_entity_sets(t.entities) for t in (heads, tails)]
    assert graphs[0].n_sensitive == graphs[1].n_sensitive and graphs[0].n_plain == graphs[1].n_plain
    choices = [choose_holders(g, 4, "best") for g in graphs]
    assert choices[0].kept == choices[1].kept and choices[0].holders == choices[1].holders
    assert [len(v) for v in heads.texts.values()] == [len(v) for v in tails.texts.values()]
    assert heads.redacted == tails.redacted  # only the names differ, and they are redacted alike
    changed = _sentences(heads.texts) ^ _sentences(tails.texts)
    canary = plan.canaries[5]
    assert changed == set(zip(canary.hosts, canary.texts(canary.secret))) | set(zip(canary.hosts, canary.texts(canary.decoy)))


def test_selective_secrets_are_private_spans_and_redacted_in_the_public_phase(demo_home) -> None:
    plan, texts = _texts(demo_home, "selective", count=4)
    for canary in plan.canaries:
        value = canary.secret if plan.included[canary.index] else canary.decoy
        host = canary.hosts[0]
        assert texts.texts[host] == canary.texts(value)
        (start, end), = texts.spans[host][0]
        assert texts.texts[host][0][start:end] == value
        assert value not in texts.redacted[host][0] and "[PERSON]" in texts.redacted[host][0]


def test_selective_coins_leave_the_public_phase_text_alone(demo_home) -> None:
    _, heads = _texts(demo_home, "selective", (True,) * 4, count=4)
    _, tails = _texts(demo_home, "selective", (False,) * 4, count=4)
    assert heads.redacted == tails.redacted and heads.texts != tails.texts


def test_mechanisms_without_an_audit_design_say_why() -> None:
    from uedp.services.config import TrainConfig

    with pytest.raises(ValueError, match="custext cannot be audited this way: canaries would have to be planted"):
        TrainConfig(dataset="demo", mechanism="custext", embeddings="glove.txt", target_epsilon=1.0, audit_canaries=8)
    with pytest.raises(ValueError, match="not for classifiers"):
        TrainConfig(dataset="demo", mechanism="noiseless", model="bert", audit_canaries=8)
    with pytest.raises(ValueError, match=r"recurrent selective .* accounts one private token's value"):
        TrainConfig(dataset="demo", mechanism="selective", model="lstm", audit_canaries=8)


# --- the participation record -----------------------------------------------------------------------


def test_the_record_counts_the_rounds_a_run_really_sampled_the_host(monkeypatch) -> None:
    """Spy on the sampler of a real userdp run; the record must count exactly the rounds whose draw took
    each canary user, and give a user the run never had the same count its coin would have given."""
    from uedp.models.metrics import causal_lm_loss
    from uedp.privacy.mechanisms.base import HostUnits
    from uedp.privacy.mechanisms.params import UserDpParams
    from uedp.privacy.mechanisms.userdp import UserDp
    from uedp.privacy.population import Population
    from uedp.privacy.randomness import Randomness, RoundRandomness

    from support import fedavg_data

    data = fedavg_data(users=12, per_user=2)
    seen: dict[int, set[str]] = {}
    real = RoundRandomness.poisson_sample

    def spy(self, purpose, units, q):  # type: ignore[no-untyped-def]
        picked = real(self, purpose, units, q)
        if purpose == "sample-users":
            seen[self.round] = {units[i] for i in picked}
        return picked

    monkeypatch.setattr(RoundRandomness, "poisson_sample", spy)
    mechanism = UserDp(UserDpParams(mechanism="userdp", rounds=12, q_user=0.3, noise_multiplier=1.0, local_steps=1),
                       Population.declared(12), Randomness.seeded(7))
    mechanism.train(tiny_gpt2(), data, causal_lm_loss, CPU, lambda report: None)
    for user in ("u0", "u5", "u11"):
        assert mechanism.rounds_with(HostUnits(users=(user,)), range(1, 13)) == sum(user in s for s in seen.values())
    assert mechanism.rounds_with(HostUnits(users=("u0", "u5")), range(1, 13)) == \
        sum(bool({"u0", "u5"} & s) for s in seen.values())
    # A user the data lacks has a coin all the same (the one it would have had): planted and absent
    # canaries' hosts look alike.
    absent = f"{HOST_PREFIX}0001"
    coins = [Randomness.seeded(7).uniforms("sample-users", r, [absent])[0] < 0.3 for r in range(1, 13)]
    assert mechanism.rounds_with(HostUnits(users=(absent,)), range(1, 13)) == sum(coins)
    assert mechanism.rounds_with(HostUnits(users=("u0",)), range(4, 9)) == sum("u0" in seen[r] for r in range(4, 9))


def test_the_dpsgd_record_counts_the_steps_that_drew_the_canary_sequence(monkeypatch) -> None:
    from uedp.models.metrics import per_sequence_lm_loss
    from uedp.privacy.mechanisms.base import HostUnits
    from uedp.privacy.mechanisms.dpsgd import DpSgd
    from uedp.privacy.mechanisms.params import DpSgdParams
    from uedp.privacy.population import Population
    from uedp.privacy.randomness import Randomness, RoundRandomness

    from support import fedavg_data

    data = fedavg_data(users=6, per_user=3)
    host = f"{HOST_PREFIX}0000"
    data = replace(data, by_user={**data.by_user, host: data.by_user["u0"][:1]})
    seen: dict[int, set[str]] = {}
    real = RoundRandomness.poisson_sample

    def spy(self, purpose, units, q):  # type: ignore[no-untyped-def]
        picked = real(self, purpose, units, q)
        seen[self.round] = {units[i] for i in picked}
        return picked

    monkeypatch.setattr(RoundRandomness, "poisson_sample", spy)
    mechanism = DpSgd(DpSgdParams(mechanism="dpsgd", steps=15, batch_size=5, noise_multiplier=1.0),
                      Population.declared(19), Randomness.seeded(3))
    mechanism.train(tiny_gpt2(), data, per_sequence_lm_loss, CPU, lambda report: None)
    assert f"{host}#0" in data.sequence_ids
    count = mechanism.rounds_with(HostUnits(users=(host,), sequences=(f"{host}#0",)), range(1, 16))
    assert count == sum(f"{host}#0" in s for s in seen.values()) > 0


# --- trained models: the audit can fail -------------------------------------------------------------


def _train(home, mechanism: str, broken: bool = False, monkeypatch=None, **settings):  # type: ignore[no-untyped-def]
    from uedp.services.config import TrainConfig
    from uedp.services.launch import run_training

    if broken:  # the noise DP-SGD adds, scaled to almost nothing; the accountant still reports the calibrated z
        import uedp.privacy.mechanisms.dpsgd as dpsgd

        real = dpsgd.noise_ahead
        monkeypatch.setattr(dpsgd, "noise_ahead", lambda t, std, source: real(t, std * 1e-6, source))
    config = TrainConfig(dataset="demo", mechanism=mechanism, randomness="seeded", checkpoint_every=0,
                         threads=1, **settings)
    return run_training(home, config)


@pytest.mark.slow
def test_a_noiseless_run_is_caught_from_the_cli_and_the_bound_is_logged(demo_home) -> None:
    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from uedp.cli import app

    runner = CliRunner()
    pending = set(demo_home.audits_dir.glob("pending-*"))  # plans drawn by the data-path tests above
    trained = runner.invoke(app, ["train", "demo", "--home", str(demo_home.root), "--mechanism", "noiseless",
                                  "--steps", "600", "--lr", "2e-3", "--audit-canaries", "128", "--seeded"])
    assert trained.exit_code == 0, trained.output
    assert "one-run audit (128 canaries at the unit): epsilon >= " in trained.stdout
    run_id = trained.stdout.split("MLflow run: ")[1].split()[0]
    metrics = MlflowClient(tracking_uri=demo_home.mlflow_tracking_uri).get_run(run_id).data.metrics
    assert metrics["audit_one_run_epsilon_lower_bound"] > 0.5
    assert metrics["audit_one_run_canaries"] == 128
    attacked = runner.invoke(app, ["attack", run_id, "--home", str(demo_home.root), "--kind", "audit"])
    assert attacked.exit_code == 0, attacked.output
    assert "audit_one_run_epsilon_lower_bound" in attacked.stdout and "128 sequence canaries" in attacked.stdout
    # The coins stay in the data home; the run releases the design without them.
    assert (demo_home.audits_dir / f"{run_id}.json").is_file()
    artifacts = Path(MlflowClient(tracking_uri=demo_home.mlflow_tracking_uri).download_artifacts(
        run_id, "audit_canaries.json", str(demo_home.root / "dl")))
    assert "included" not in artifacts.read_text()
    assert set(demo_home.audits_dir.glob("pending-*")) == pending  # this run's plan was filed under its id


@pytest.mark.slow
def test_broken_dpsgd_is_caught_above_its_reported_epsilon_and_the_correct_one_is_not(demo_home, monkeypatch) -> None:
    settings = dict(target_epsilon=0.5, steps=300, lr=4e-3, audit_canaries=128)
    correct = _train(demo_home, "dpsgd", **settings)
    broken = _train(demo_home, "dpsgd", broken=True, monkeypatch=monkeypatch, **settings)
    assert correct.epsilon == pytest.approx(0.5, abs=1e-3) and broken.epsilon == correct.epsilon
    assert broken.audit_epsilon is not None and broken.audit_epsilon > broken.epsilon
    assert correct.audit_epsilon is not None and correct.audit_epsilon < correct.epsilon


@pytest.mark.slow
def test_correctly_noised_userdp_stays_below_its_epsilon(demo_home) -> None:
    result = _train(demo_home, "userdp", target_epsilon=1.0, rounds=10, q_user=0.5, audit_canaries=64)
    assert result.audit_epsilon is not None and result.audit_epsilon < result.epsilon
    from mlflow.tracking import MlflowClient

    from uedp.privacy.randomness import Randomness
    from uedp.services.audit_draw import load_for_run

    loaded = load_for_run(demo_home, result.run_id)
    assert loaded is not None and loaded[1] is not None
    plan, record = loaded
    # Every canary user's rounds, planted or not, from the run's own (seeded) sampling coins.
    root = Randomness.seeded(0)
    assert record.rounds == 10 and record.per_canary == [
        sum(root.uniforms("sample-users", r, [c.hosts[0]])[0] < 0.5 for r in range(1, 11)) for c in plan.canaries]
    metrics = MlflowClient(tracking_uri=demo_home.mlflow_tracking_uri).get_run(result.run_id).data.metrics
    assert metrics["audit_host_rounds_mean"] == pytest.approx(np.mean(record.per_canary))  # made-up hosts only


def test_a_failing_audit_leaves_the_trained_run_standing(demo_home, monkeypatch) -> None:
    import uedp.services.launch as train

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(train, "attack_run", broken)
    result = _train(demo_home, "noiseless", steps=5, audit_canaries=4)
    assert result.audit_epsilon is None and "audit failed: RuntimeError: CUDA out of memory" in result.notes
    assert (demo_home.audits_dir / f"{result.run_id}.json").is_file()


def test_the_sweep_report_shows_each_seeds_bound_and_plots_it_against_epsilon(tmp_path: Path) -> None:
    from uedp.services.report import markdown, summarise, write_report
    from uedp.services.training import TrainResult

    def result(mechanism: str, epsilon: float, seed_bound: float | None, run: str) -> TrainResult:
        return TrainResult(run_id=run, mechanism=mechanism, categories=["PER"], epsilon=epsilon, delta=1e-5,
                           noise_multiplier=1.0, utility_metric="perplexity", utility_valid=9.0, utility_test=9.5,
                           rounds=10, audit_epsilon=seed_bound)

    outcomes = [(result("dpsgd", 2.0, 0.25, "a" * 32), 2.0), (result("dpsgd", 2.0, 0.0, "b" * 32), 2.0),
                (result("noiseless", float("inf"), 1.9, "c" * 32), None), (result("userdp", 2.0, None, "d" * 32), 2.0)]
    rows = summarise(outcomes)
    table = markdown(rows, "t")
    assert "| audit bound |" in table
    dpsgd = next(line for line in table.splitlines() if line.startswith("| dpsgd"))
    assert "| 0.25 / 0 |" in dpsgd  # each seed's bound, not their mean
    assert "| - |" in next(line for line in table.splitlines() if line.startswith("| userdp"))
    files = write_report(rows, tmp_path / "report", "t")
    assert tmp_path / "report" / "audit_vs_epsilon.png" in files
    assert (tmp_path / "report" / "audit_vs_epsilon.png").stat().st_size > 10_000


def test_a_resumed_secure_run_plants_the_same_canaries_and_counts_rounds_since_the_resume(home, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.services.audit_draw import load_for_run
    from uedp.services.config import TrainConfig
    from uedp.services.detect import detect_entities
    from uedp.services.tracking import RunTracker
    from uedp.services.training import train_configuration
    from uedp.storage.ingest import IngestOptions, ingest

    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    config = TrainConfig(dataset="demo", mechanism="userdp", rounds=6, checkpoint_every=2, q_user=0.3, local_steps=1,
                         audit_canaries=6, threads=1)  # secure randomness: the resume draws a new root
    original = RunTracker.log_metrics

    def crash_at_round_5(self, metrics, step=0):  # type: ignore[no-untyped-def]
        if step == 5 and "epsilon" in metrics:
            raise KeyboardInterrupt
        return original(self, metrics, step)

    monkeypatch.setattr(RunTracker, "log_metrics", crash_at_round_5)
    with pytest.raises(KeyboardInterrupt):
        train_configuration(home, config, progress=False)
    monkeypatch.setattr(RunTracker, "log_metrics", original)
    (pending,) = home.audits_dir.glob("pending-*.json")
    before = AuditDraw.from_json(pending.read_text())
    resumed = train_configuration(home, config, progress=False)
    assert resumed.resumed_from == 4 and not pending.exists()
    loaded = load_for_run(home, resumed.run_id)
    assert loaded is not None and loaded[0] == before and loaded[1] is not None
    assert (loaded[1].first_round, loaded[1].last_round) == (5, 6)
    # Without its plan, a checkpoint of audit canaries cannot go on.
    monkeypatch.setattr(RunTracker, "log_metrics", crash_at_round_5)
    with pytest.raises(KeyboardInterrupt):
        train_configuration(home, config, progress=False)
    monkeypatch.setattr(RunTracker, "log_metrics", original)
    for plan in home.audits_dir.glob("pending-*.json"):
        plan.unlink()
    from uedp.errors import UedpError

    with pytest.raises(UedpError, match=r"trained on audit canaries whose draw .* is gone"):
        train_configuration(home, config, progress=False)


def test_the_uedp_bounded_record_counts_only_hosts_that_keep_the_entity(demo_home) -> None:
    """With k = 1 one of the canary's 4 hosts keeps its sentence: only that host's rounds count."""
    from uedp.privacy.mechanisms.base import HostUnits, TrainData
    from uedp.privacy.mechanisms.params import UeDpBoundedParams
    from uedp.privacy.mechanisms.uedp_bounded import KeptHolders, UeDpBounded
    from uedp.privacy.randomness import Randomness
    from uedp.services.audit_draw import host_units

    plan, texts = _texts(demo_home, "uedp-bounded", count=4, holders_per_entity=1)
    mechanism = UeDpBounded(UeDpBoundedParams(mechanism="uedp-bounded", holders_per_entity=1, noise_multiplier=2.0,
                                              q_user=0.5), Randomness.seeded(1))
    placeholders = {u: [torch.zeros(2, dtype=torch.long)] * len(sets) for u, sets in texts.entities.items()}
    kept = mechanism.select(TrainData(placeholders, 0, entities=texts.entities)).sampling
    assert isinstance(kept, KeptHolders)
    root, rounds = Randomness.seeded(1), range(1, 21)
    for canary in plan.canaries:
        units = host_units(plan, canary)
        keepers = [u for u in canary.hosts if any(
            kept_here and units.entities[0] in keys
            for kept_here, keys in zip(kept.choice.kept[kept.graph.users.index(u)], texts.entities[u]))]
        assert len(keepers) == 1
        expected = sum(root.uniforms("sample-users", r, [keepers[0]])[0] < 0.5 for r in rounds)
        assert kept.rounds_with(units, rounds) == expected
        assert kept.rounds_with(HostUnits(users=units.users), rounds) >= expected  # all 4 hosts
