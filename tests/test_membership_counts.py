"""Membership AUCs come with the number of members and non-members and a 95% interval (issue 37, item 9):
the counts are a configured sample size (--members, --member-users), public, never the exact number of
private training units (docs/PRIVACY.md: such counts are not released to MLflow)."""

from __future__ import annotations

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.cli import app
from uedp.detection.pipeline import DetectorConfig
from uedp.flows.demo import DEMO_CORPUS
from uedp.privacy.attacks.membership import TooFewCandidates, fixed_sample, membership_attack
from uedp.privacy.attacks.metrics import attack_figures, auc_interval
from uedp.services.detect import detect_entities
from uedp.storage.catalog import Catalog
from uedp.storage.ingest import IngestOptions, ingest

runner = CliRunner()


def test_the_auc_interval_contains_the_estimate_and_narrows_with_more_samples() -> None:
    rng = np.random.default_rng(0)
    widths = []
    for n in (50, 200, 800):
        figures = attack_figures(rng.normal(0.4, 1, n), rng.normal(0, 1, n))
        assert 0 <= figures.auc_low < figures.auc < figures.auc_high <= 1
        assert (figures.members, figures.non_members) == (n, n)
        widths.append(figures.auc_high - figures.auc_low)
        metrics = figures.as_metrics("mia_user")
        assert (metrics["mia_user_auc_low"], metrics["mia_user_auc_high"]) == (figures.auc_low, figures.auc_high)
    assert widths[0] > widths[1] > widths[2]
    assert widths[0] / widths[2] == pytest.approx(4, rel=0.15)  # 16 times the samples: a quarter as wide
    # Hanley and McNeil (1982): A = 0.61 on 200 and 200 gives SE 0.0281, so 0.555 to 0.665 at 95%.
    low, high = auc_interval(0.61, 200, 200)
    assert (low, high) == (pytest.approx(0.5550, abs=5e-4), pytest.approx(0.6650, abs=5e-4))
    assert auc_interval(1.0, 5, 5) == (1.0, 1.0) and auc_interval(0.5, 1, 1) == (0.0, 1.0)  # clipped to [0, 1]


def test_the_attack_draws_exactly_the_configured_sample_or_refuses_without_the_count() -> None:
    members, non_members = np.arange(37, dtype=float), -np.arange(23, dtype=float)
    m, n = fixed_sample(members, non_members, 20, seed=3)
    assert len(m) == len(n) == 20 and len(set(m)) == 20 and set(m) <= set(members) and set(n) <= set(non_members)
    again = fixed_sample(members, non_members, 20, seed=3)
    assert (again[0] == m).all() and (again[1] == n).all()  # seeded
    with pytest.raises(TooFewCandidates) as refused:
        fixed_sample(members, non_members, 30, seed=3)  # 37 members but only 23 non-members
    assert "30" in str(refused.value) and "23" not in str(refused.value) and "37" not in str(refused.value)
    result = membership_attack("user", "none", members, non_members, 20)
    assert (result.figures.members, result.figures.non_members) == (20, 20)
    assert result.line() == (f"user membership AUC {result.figures.auc:.2f} (95% CI {result.figures.auc_low:.2f}-"
                             f"{result.figures.auc_high:.2f}; 20 members, 20 non-members)")


def test_attacking_a_run_logs_the_sample_sizes_and_intervals_never_the_exact_counts(home) -> None:  # type: ignore[no-untyped-def]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    trained = runner.invoke(app, ["train", "demo", "--home", str(home.root), "--mechanism", "noiseless", "--steps", "3",
                                  "--log-model", "--seeded", "--threads", "1"])
    assert trained.exit_code == 0, trained.output
    run_id = trained.stdout.split("MLflow run: ")[1].split()[0]
    with Catalog(home, "demo") as catalog:
        rows = {split: catalog.sentences(split) for split in ("train", "test")}
    exact = {len(rows["train"]), len(rows["test"]), len({u for _, u, _ in rows["train"]}),
             len({u for _, u, _ in rows["test"]})}
    sentences, users = 40, 3
    assert sentences < len(rows["test"]) and users < len({u for _, u, _ in rows["test"]})
    assert not exact & {sentences, users}  # the sizes chosen differ from every exact count

    attacked = runner.invoke(app, ["attack", run_id, "--home", str(home.root), "--kind", "mia", "--members",
                                   str(sentences), "--member-users", str(users)])
    assert attacked.exit_code == 0, attacked.output
    run = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(run_id)
    logged = run.data.metrics
    assert (logged["mia_sentence_members"], logged["mia_sentence_non_members"]) == (sentences, sentences)
    assert (logged["mia_user_members"], logged["mia_user_non_members"]) == (users, users)
    for level in ("sentence", "user", "sentence_zlib", "user_zlib"):
        assert logged[f"mia_{level}_auc_low"] <= logged[f"mia_{level}_auc"] <= logged[f"mia_{level}_auc_high"]
    said = " ".join(attacked.output.split())
    for level, n in (("sentence", sentences), ("user", users)):
        auc, low, high = (logged[f"mia_{level}_auc{end}"] for end in ("", "_low", "_high"))
        assert (f"{level} membership AUC {auc:.2f} (95% CI {low:.2f}-{high:.2f}; {n} members, {n} non-members)"
                in said), said
    assert run.data.tags["uedp.attack.members"] == str(sentences)
    assert run.data.tags["uedp.attack.member_users"] == str(users)
    # No membership figure, tag or parameter is an exact count of the private data.
    released = [v for k, v in logged.items() if k.startswith("mia_")]
    released += [run.data.tags[k] for k in ("uedp.attack.members", "uedp.attack.member_users")]
    assert not [v for v in released if str(v).removesuffix(".0") in {str(n) for n in exact}], released
    assert not [k for k in logged if k.startswith("mia_entity")]  # too few unseen entities: said, not logged
    assert "entity membership: not attacked" in said

    # More than the data holds: refused at every level, saying the sizes asked for, not the counts.
    refused = runner.invoke(app, ["attack", run_id, "--home", str(home.root), "--kind", "mia", "--members", "100000",
                                  "--member-users", "100000"])
    assert refused.exit_code == 2 and "pass a smaller --members or --member-users" in refused.output
    failure = next(line for line in refused.output.splitlines() if "mia failed" in line)
    assert not [n for n in exact if str(n) in failure.replace("100000", "")], failure
    skipped = runner.invoke(app, ["attack", run_id, "--home", str(home.root), "--members", "100000",
                                  "--member-users", "100000", "--kind", "all"])
    assert "skipped mia: no level has enough candidates" in " ".join(skipped.output.split())
