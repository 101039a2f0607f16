"""Budgets across runs (issue 37, item 2): every release from a dataset goes into its privacy ledger, the
releases of one unit compose (dp_accounting), a rerun says what it adds, and a budget is kept.

Real training (tiny GPT-2s on the bundled demo corpus), real MLflow store, real local-DP release, real
CLI. The soundness test is the first: what a run reserves before round 1 must be what it states at the end.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.commands import app
from uedp.detection.pipeline import DetectorConfig
from uedp.errors import UedpError
from uedp.flows.demo import DEMO_CORPUS
from uedp.privacy.accounting.composition import compose_guarantees
from uedp.services import privacy_budget
from uedp.services.config import TrainConfig
from uedp.services.detect import detect_entities
from uedp.services.sanitize import sanitize_dataset
from uedp.services.sanitize_config import SanitizeConfig
from uedp.services.tracking import RunTracker
from uedp.services.training import train_configuration
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.privacy_ledger import FINISHED, RESERVED, LedgerEntry, PrivacyLedger

from support import demo_halves, demo_vectors, write

runner = CliRunner()


@pytest.fixture
def demo(home) -> str:  # type: ignore[no-untyped-def]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    return "demo"


def _entries(home, dataset: str = "demo") -> tuple[LedgerEntry, ...]:  # type: ignore[no-untyped-def]
    return privacy_budget.ledger_of(home, dataset).read().entries


def _runs(home, dataset: str = "demo") -> int:  # type: ignore[no-untyped-def]
    client = MlflowClient(tracking_uri=home.mlflow_tracking_uri)
    experiment = client.get_experiment_by_name(dataset)
    return 0 if experiment is None else len(client.search_runs([experiment.experiment_id]))


# Composition ------------------------------------------------------------------------------------------


def test_releases_compose_by_dp_accountings_optimal_composition_of_what_each_stated() -> None:
    assert compose_guarantees([]) == (0.0, 0.0)
    assert compose_guarantees([(2.0, 1e-5)]) == (2.0, 1e-5)
    epsilon, delta = compose_guarantees([(2.0, 1e-5), (3.0, 1e-5)])
    assert delta == pytest.approx(2e-5) and 3.0 < epsilon <= 5.0 and epsilon == pytest.approx(5.0, abs=1e-6)
    # pure DP adds exactly; many small releases never compose above their sum
    assert compose_guarantees([(0.5, 0.0)] * 10)[0] == pytest.approx(5.0, abs=1e-3)
    assert compose_guarantees([(0.1, 1e-6)] * 40)[0] <= 4.0 + 1e-9
    assert compose_guarantees([(2.0, 1e-5), (math.inf, 0.0)])[0] == math.inf


def test_a_composed_total_is_remembered_by_the_stated_guarantees_and_equals_a_fresh_composition(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`uedp budget` of a ledger seen before reads its totals from the data home's accounting cache: the same
    figure dp_accounting composes afresh, and another list of guarantees is never served it."""
    from uedp.privacy.accounting import memo
    from uedp.privacy.accounting.composition import _composed_epsilon

    monkeypatch.setenv(memo.CACHE_ENV, str(tmp_path))
    memo.forget()
    stated = [(1.5, 1e-6), (0.7, 1e-6), (2.0, 0.0)]
    first = compose_guarantees(stated)
    assert first[0] == _composed_epsilon(tuple(stated), first[1])  # what dp_accounting gives, uncached
    assert len(list(tmp_path.glob("composition-*.json"))) == 1
    memo.forget()  # a new process: only the folder remembers
    assert compose_guarantees(stated) == first
    other = compose_guarantees([(1.5, 1e-6), (0.7, 1e-6), (2.5, 0.0)])
    assert other[0] > first[0] and len(list(tmp_path.glob("composition-*.json"))) == 2


# What a run reserves is what it states -----------------------------------------------------------------


TINY = dict(checkpoint_every=0, threads=1)
CONFIGS = {
    "dpsgd": dict(mechanism="dpsgd", steps=3, batch_size=8, noise_multiplier=1.0),
    "dpsgd stopped by its budget": dict(mechanism="dpsgd", steps=40, batch_size=8, noise_multiplier=0.8,
                                        max_epsilon=1.0),
    "selective": dict(mechanism="selective", steps=2, public_steps=1, batch_size=8, noise_multiplier=1.0,
                      categories="PER"),
    "userdp": dict(mechanism="userdp", rounds=2, q_user=0.5, local_steps=1, noise_multiplier=1.0),
    "userdp calibrated": dict(mechanism="userdp", rounds=2, q_user=0.5, local_steps=1, target_epsilon=6.0),
    "selective recurrent (lstm)": dict(mechanism="selective", model="lstm", steps=2, batch_size=8,
                                       noise_multiplier=1.0, categories="PER"),
    "uedp": dict(mechanism="uedp", rounds=2, q_user=0.5, q_entity=0.5, local_steps=1, noise_multiplier=2.0,
                 categories="PER"),
    "uedp-naive": dict(mechanism="uedp-naive", rounds=2, q_user=0.5, q_entity=0.5, local_steps=1,
                       noise_multiplier=2.0, categories="PER"),
    "uedp-bounded": dict(mechanism="uedp-bounded", rounds=2, q_user=0.5, local_steps=1, noise_multiplier=1.0,
                         holders_per_entity=1, categories="PER"),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_private_mechanism_reserves_before_round_one_exactly_the_epsilon_its_run_states(
        home, demo: str, name: str, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The reservation is the mechanism's own accounting of its plan, made before any round: if it were
    below the stated epsilon, a budget could be exceeded by a run it let start."""
    filed: list[privacy_budget.Charge] = []
    original = privacy_budget.file

    def spy(home_, dataset, release):  # type: ignore[no-untyped-def]
        filed.append(release)
        assert not any(e.key == release.key for e in _entries(home_, dataset))  # filed before training
        return original(home_, dataset, release)

    monkeypatch.setattr(privacy_budget, "file", spy)
    result = train_configuration(home, TrainConfig(dataset=demo, **CONFIGS[name], **TINY), progress=False)
    assert len(filed) == 1 and math.isfinite(result.epsilon)
    assert filed[0].epsilon == pytest.approx(result.epsilon, rel=1e-9, abs=1e-12)
    [entry] = _entries(home)
    assert (entry.key, entry.status, entry.unit) == (f"run:{result.run_id}", FINISHED, result.unit)
    assert entry.epsilon == result.epsilon and entry.delta == result.delta


# Reruns, the ledger command and a budget ----------------------------------------------------------------


def test_a_rerun_says_what_it_adds_the_ledger_composes_and_a_budget_refuses_before_an_mlflow_run_opens(
        home, demo: str) -> None:  # type: ignore[no-untyped-def]
    train = ["train", demo, "--home", str(home.root), "--mechanism", "userdp", "--rounds", "2", "--q-user", "0.5",
             "--local-steps", "1", "--threads", "1", "--checkpoint-every", "0"]
    first = runner.invoke(app, train)
    assert first.exit_code == 0, first.output
    assert "already spent" not in first.stderr
    second = runner.invoke(app, train)
    assert second.exit_code == 0, second.output
    [one, two] = _entries(home)
    total, delta = compose_guarantees([(one.epsilon, one.delta), (two.epsilon, two.delta)])
    assert re.search(rf"'demo' has already spent epsilon {one.epsilon:.4g} \(delta 1e-05\) on one user \(all of their "
                     rf"sentences\), over 1 release of its text; this run adds up to {two.epsilon:.4g}: {total:.4g} \(delta 2e-05\) "
                     "in all", second.stderr.replace("\n", " ")), second.stderr

    shown = runner.invoke(app, ["budget", demo, "--home", str(home.root)])
    assert shown.exit_code == 0, shown.output
    assert f"one user (all of their sentences): epsilon {total:.4g} at delta {delta:.3g} over 2 release(s)" in shown.stdout
    assert one.key.removeprefix("run:") in shown.stdout and "budget: none" in shown.stdout

    limit = total + one.epsilon / 2  # room for half a run more
    assert runner.invoke(app, ["budget", demo, "--home", str(home.root), "--limit", f"{limit}"]).exit_code == 0
    runs = _runs(home)
    refused = runner.invoke(app, train)
    assert refused.exit_code == 2
    assert "past its budget" in refused.stderr and "uedp budget demo --limit EPSILON" in refused.stderr
    assert _runs(home) == runs and len(_entries(home)) == 2  # nothing opened, nothing filed

    smaller = runner.invoke(app, [*train, "--max-epsilon", f"{one.epsilon / 3}"])
    assert smaller.exit_code == 0, smaller.output  # within what is left: it runs
    assert len(_entries(home)) == 3 and _entries(home)[-1].epsilon <= one.epsilon / 3

    noiseless = runner.invoke(app, ["train", demo, "--home", str(home.root), "--mechanism", "noiseless", "--steps", "2",
                                    "--threads", "1"])
    assert noiseless.exit_code == 2 and "noiseless would exceed it: it has no guarantee" in noiseless.stderr
    assert runner.invoke(app, ["budget", demo, "--home", str(home.root), "--no-limit"]).exit_code == 0
    assert runner.invoke(app, ["train", demo, "--home", str(home.root), "--mechanism", "noiseless", "--steps", "2",
                               "--threads", "1"]).exit_code == 0
    after = runner.invoke(app, ["budget", demo, "--home", str(home.root)])
    assert "1 run(s) without a guarantee" in after.stdout and "budget: none" in after.stdout


def test_a_resumed_run_is_charged_once_and_an_attempt_that_stopped_stays_charged(
        home, demo: str, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    train = ["train", demo, "--home", str(home.root), "--mechanism", "dpsgd", "--steps", "4", "--batch-size", "4",
             "--noise-multiplier", "1", "--threads", "1"]
    original = RunTracker.log_metrics

    def ctrl_c_at(step_: int):  # type: ignore[no-untyped-def]
        def log_metrics(self, metrics, step=0):  # type: ignore[no-untyped-def]
            if step == step_ and "train_loss" in metrics:
                raise KeyboardInterrupt
            return original(self, metrics, step)
        return log_metrics

    # interrupted after a checkpoint: the rerun resumes the same MLflow run and the same entry
    monkeypatch.setattr(RunTracker, "log_metrics", ctrl_c_at(3))
    assert runner.invoke(app, [*train, "--checkpoint-every", "2"]).exit_code == 130
    [reserved] = _entries(home)
    assert reserved.status == RESERVED and reserved.epsilon > 0
    # a budget with room for this run alone: resuming it must not count its own reservation twice
    assert runner.invoke(app, ["budget", demo, "--home", str(home.root), "--limit", f"{reserved.epsilon * 1.01}"]
                         ).exit_code == 0
    monkeypatch.setattr(RunTracker, "log_metrics", original)
    resumed = runner.invoke(app, [*train, "--checkpoint-every", "2"])
    assert resumed.exit_code == 0, resumed.output
    assert runner.invoke(app, ["budget", demo, "--home", str(home.root), "--no-limit"]).exit_code == 0
    assert "resumed from the checkpoint" in resumed.stderr and "already spent" not in resumed.stderr
    [entry] = _entries(home)
    assert entry.key == reserved.key and entry.status == FINISHED
    assert entry.epsilon == pytest.approx(reserved.epsilon)

    # interrupted before any checkpoint: it had released its DP count (in its noise-to-signal) and run a
    # round, so it stays charged at its plan, and the next attempt (a new MLflow run) is charged too
    monkeypatch.setattr(RunTracker, "log_metrics", ctrl_c_at(1))
    assert runner.invoke(app, [*train, "--checkpoint-every", "0"]).exit_code == 130
    assert [e.status for e in _entries(home)] == [FINISHED, RESERVED]
    monkeypatch.setattr(RunTracker, "log_metrics", original)
    again = runner.invoke(app, [*train, "--checkpoint-every", "0"])
    assert again.exit_code == 0, again.output
    entries = _entries(home)
    assert [e.status for e in entries] == [FINISHED, RESERVED, FINISHED] and entries[0] == entry
    assert "over 2 releases of its text" in again.stderr.replace("\n", " ")
    shown = runner.invoke(app, ["budget", demo, "--home", str(home.root)])
    assert "reserved: a run still training, or one that stopped before it finished" in shown.stdout


def test_a_model_used_again_costs_nothing_on_the_data_it_was_trained_on(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    private, public = demo_halves(tmp_path)  # no sentence in common
    ingest(home, "private", [private], IngestOptions(format="conll2003"))
    ingest(home, "public", [public], IngestOptions(format="conll2003", split="users", split_seed=1))
    pretrained = train_configuration(home, TrainConfig(dataset="public", mechanism="noiseless", steps=2, log_model=True,
                                                       **TINY), progress=False)
    before = _entries(home, "public")
    assert [(e.unit, e.epsilon) for e in before] == [("none", math.inf)]
    tuned = train_configuration(home, TrainConfig(dataset="private", init_from=pretrained.run_id, **CONFIGS["userdp"],
                                                  **TINY), progress=False)
    assert _entries(home, "public") == before  # starting from a released model releases nothing new from its data
    assert [e.key for e in _entries(home, "private")] == [f"run:{tuned.run_id}"]


BOUNDED = ["--mechanism", "uedp-bounded", "--holders-per-entity", "1", "--rounds", "2", "--q-user", "0.5",
           "--local-steps", "1", "--noise-multiplier", "4", "--threads", "1", "--checkpoint-every", "0"]  # epsilon 2.895


def _train(home, dataset: str, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["train", dataset, "--home", str(home.root), *args])


def test_runs_that_protect_the_same_entities_compose_across_category_lists_and_detections(
        home, demo: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 47, item 4: PER, then PER+LOC after the same gold detection was redone (an ignore list naming
    nothing in the corpus: new entities table, the same spans), then PER again, each at epsilon 2.9 under a
    budget of 7: the third would take the PER entities' total to 8.7, so it is refused (on main before the
    fix, three totals of 2.9 and no refusal)."""
    assert runner.invoke(app, ["budget", demo, "--home", str(home.root), "--limit", "7"]).exit_code == 0
    first = _train(home, demo, *BOUNDED, "--categories", "PER")
    assert first.exit_code == 0, first.output
    nothing = write(tmp_path / "ignore.txt", "PERSON: Nobody Atall\n")
    redetected = runner.invoke(app, ["detect", demo, "--home", str(home.root), "--detector", "gold",
                                     "--ignore-entities", str(nothing)])
    assert redetected.exit_code == 0, redetected.output
    second = _train(home, demo, *BOUNDED, "--categories", "PER,LOC")
    assert second.exit_code == 0, second.output
    assert "has already spent epsilon" in second.stderr  # the same unit and text: said before it trains
    one, two = _entries(home)
    assert one.scope != two.scope  # another category list and another entities table ...
    [total] = privacy_budget.unit_totals(_entries(home))  # ... and one total all the same
    assert total.releases == 2 and total.categories == ("LOC", "PERSON") and total.mixed
    assert total.epsilon == pytest.approx(compose_guarantees([(one.epsilon, one.delta), (two.epsilon, two.delta)])[0])
    assert 5.7 < total.epsilon <= 5.8
    runs = _runs(home)
    third = _train(home, demo, *BOUNDED, "--categories", "PER")
    assert third.exit_code == 2 and "past its budget 7" in third.stderr, third.output
    assert _runs(home) == runs and len(_entries(home)) == 2  # refused before anything opened or was filed
    shown = runner.invoke(app, ["budget", demo, "--home", str(home.root)])
    assert "[categories LOC,PERSON]: epsilon" in shown.stdout and "over 2 release(s)" in shown.stdout
    assert "composed into one total because one entity can carry several categories" in shown.stdout.replace("\n", " ")


def test_a_seeded_run_is_in_no_total_and_a_budget_refuses_it(home, demo: str) -> None:  # type: ignore[no-untyped-def]
    """A seeded run's seed is logged with it: its noise can be recomputed, so it bounds nothing."""
    seeded = _train(home, demo, *BOUNDED, "--categories", "PER", "--seeded")
    assert seeded.exit_code == 0, seeded.output
    [entry] = _entries(home)
    assert entry.randomness == "seeded" and privacy_budget.unit_totals(_entries(home)) == []
    secure = _train(home, demo, *BOUNDED, "--categories", "PER")
    assert secure.exit_code == 0 and "already spent" not in secure.stderr  # nothing to add the seeded run to
    [total] = privacy_budget.unit_totals(_entries(home))
    assert total.releases == 1 and total.epsilon == _entries(home)[1].epsilon
    shown = runner.invoke(app, ["budget", demo, "--home", str(home.root)]).stdout.replace("\n", " ")
    assert "1 seeded release(s), not in any total" in shown and "over 1 release(s)" in shown
    # a budget below what is spent: said when it is set, and marked wherever the total is shown (issue 68, 2)
    below = runner.invoke(app, ["budget", demo, "--home", str(home.root), "--limit", f"{total.epsilon / 2:g}"])
    assert below.exit_code == 0 and "is below what 'demo' has already spent" in below.stderr, below.output
    assert "OVER THE BUDGET of epsilon" in runner.invoke(app, ["budget", demo, "--home", str(home.root)]).stdout
    for bad in ("0", "-3", "inf"):  # one error line, not a usage box
        refused_limit = runner.invoke(app, ["budget", demo, "--home", str(home.root), "--limit", bad])
        assert refused_limit.exit_code == 2 and refused_limit.stderr.startswith(f"error: --limit {bad}"), \
            refused_limit.output
        assert "Usage" not in refused_limit.output
    assert runner.invoke(app, ["budget", demo, "--home", str(home.root), "--limit", "50"]).exit_code == 0
    assert "OVER THE BUDGET" not in runner.invoke(app, ["budget", demo, "--home", str(home.root)]).stdout
    refused = _train(home, demo, *BOUNDED, "--categories", "PER", "--seeded")
    assert refused.exit_code == 2 and "would exceed it: it is seeded" in refused.stderr, refused.output
    assert len(_entries(home)) == 2


def test_the_same_text_under_another_name_and_split_shares_its_totals_and_its_budget(
        home, demo: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 47, item 3 for the ledger: a re-ingested copy of demo (another name, another split seed) is the
    same people's text, so its runs count toward demo's totals and demo's budget holds them back."""
    ingest(home, "copy", [DEMO_CORPUS], IngestOptions(format="conll2003", split="users", split_seed=7))
    detect_entities(home, "copy", DetectorConfig(detectors=["gold"]))
    assert privacy_budget.text_of(home, "copy") == privacy_budget.text_of(home, demo) != ""
    assert _train(home, demo, *BOUNDED, "--categories", "PER").exit_code == 0
    assert runner.invoke(app, ["budget", demo, "--home", str(home.root), "--limit", "3"]).exit_code == 0
    refused = _train(home, "copy", *BOUNDED, "--categories", "PER")
    assert refused.exit_code == 2 and "set on 'demo', which holds the same text" in refused.stderr, refused.output
    assert runner.invoke(app, ["budget", demo, "--home", str(home.root), "--no-limit"]).exit_code == 0
    on_copy = _train(home, "copy", *BOUNDED, "--categories", "PER")
    assert on_copy.exit_code == 0 and "has already spent epsilon" in on_copy.stderr, on_copy.output
    shown = runner.invoke(app, ["budget", demo, "--home", str(home.root)]).stdout.replace("\n", " ")
    assert "the same text is held by 'copy' too" in shown and "over 2 release(s)" in shown
    # half of it is another whole text, but it holds the sentences of demo's train split: the same people's
    # (issue 62, item 7; on 21ae03f its totals were its own)
    lines = DEMO_CORPUS.read_text().splitlines(keepends=True)
    ingest(home, "half", [write(tmp_path / "half.conll", "".join(lines[: len(lines) // 2]))],
           IngestOptions(format="conll2003", split="users"))
    detect_entities(home, "half", DetectorConfig(detectors=["gold"]))
    assert privacy_budget.text_of(home, "half") != privacy_budget.text_of(home, demo)
    on_half = _train(home, "half", *BOUNDED, "--categories", "PER")
    assert on_half.exit_code == 0 and "'half' has already spent epsilon" in on_half.stderr, on_half.output
    assert "over 2 releases of its text" in on_half.stderr.replace("\n", " ")


def test_parallel_attempts_of_one_configuration_are_both_charged(home) -> None:  # type: ignore[no-untyped-def]
    """Two processes training the same configuration release two models: neither entry replaces the other."""
    first = privacy_budget.Charge("run:a", "dpsgd", "one training sequence", 3.0, 1e-5, "a", "secure", fingerprint="f")
    second = privacy_budget.Charge("run:b", "dpsgd", "one training sequence", 3.0, 1e-5, "b", "secure",
                                    fingerprint="f")
    privacy_budget.file(home, "demo", first)
    privacy_budget.file(home, "demo", second)
    privacy_budget.settle(home, "demo", first, 3.0, 1e-5)
    privacy_budget.settle(home, "demo", second, 3.0, 1e-5)
    [total] = privacy_budget.unit_totals(_entries(home))
    assert total.releases == 2 and total.epsilon == pytest.approx(6.0, abs=1e-6)


# Local-DP releases ---------------------------------------------------------------------------------------


@pytest.fixture
def vectors(tmp_path: Path) -> Path:
    return demo_vectors(tmp_path / "vectors.txt")


def test_a_local_dp_release_is_charged_once_and_training_on_it_costs_nothing(home, demo: str, vectors: Path) -> None:  # type: ignore[no-untyped-def]
    config = SanitizeConfig(dataset=demo, epsilon=1.0, k=5, embeddings=str(vectors))
    said: list[str] = []
    release = sanitize_dataset(home, config, say=said.append)
    [entry] = _entries(home)
    assert entry.key.startswith("release:") and entry.status == FINISHED and entry.delta == 0.0
    assert entry.epsilon == release.per_token_epsilon and entry.name == release.dataset and not said
    sanitize_dataset(home, config)  # reused: the same release
    train_configuration(home, TrainConfig(dataset=demo, mechanism="custext", target_epsilon=1.0, embeddings=str(vectors),
                                          k=5, steps=2, categories="PII", **TINY), progress=False)  # on the release
    train_configuration(home, TrainConfig(dataset=release.dataset, mechanism="noiseless", steps=2, **TINY),
                        progress=False)  # on the sanitized dataset itself
    assert _entries(home) == (entry,) and _entries(home, release.dataset) == ()
    shown = runner.invoke(app, ["budget", release.dataset, "--home", str(home.root)])
    assert "is a local-DP release of 'demo'" in shown.stdout
    refused = runner.invoke(app, ["budget", release.dataset, "--home", str(home.root), "--limit", "1"])
    assert refused.exit_code == 2 and "set it on the source: uedp budget demo --limit 1" in refused.stderr

    assert runner.invoke(app, ["budget", demo, "--home", str(home.root), "--limit", "1.5"]).exit_code == 0
    with pytest.raises(UedpError, match=r"past its budget 1\.5"):  # a second release of the same unit: 2 > 1.5
        sanitize_dataset(home, config.model_copy(update={"output": "another"}))
    assert _entries(home) == (entry,) and not home.dataset_dir("another").exists()


# The file ------------------------------------------------------------------------------------------------


def _file_many(root: str, prefix: str, count: int) -> None:
    from uedp.storage.home import DataHome

    home = DataHome.from_env(Path(root))
    for i in range(count):
        privacy_budget.file(home, "demo", privacy_budget.Charge(f"run:{prefix}{i}", "dpsgd", "one training sequence",
                                                                 0.01, 1e-7, f"{prefix}{i}", "secure"))


@pytest.mark.slow
def test_parallel_runs_lose_no_entry(home) -> None:  # type: ignore[no-untyped-def]
    """A sweep's tasks train in parallel: each filing reads, adds and writes under the ledger's lock."""
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_file_many, args=(str(home.root), prefix, 25)) for prefix in "ab"]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    assert len(_entries(home)) == 50


def test_a_damaged_ledger_is_an_error_naming_its_file_and_a_failed_write_leaves_the_old_one(home) -> None:  # type: ignore[no-untyped-def]
    ledger = PrivacyLedger(home.dataset_dir("demo"))
    release = privacy_budget.Charge("run:x", "dpsgd", "one training sequence", 1.0, 1e-5, "x", "secure")
    privacy_budget.file(home, "demo", release)
    before = ledger.path.read_text()
    with pytest.raises(RuntimeError), ledger.editing() as editor:
        editor.set_limit(3.0)
        raise RuntimeError("crash before the write")
    assert ledger.path.read_text() == before and json.loads(before)["limit"] is None
    ledger.path.write_text("{not json")
    with pytest.raises(UedpError, match=re.escape(str(ledger.path))):
        ledger.read()
