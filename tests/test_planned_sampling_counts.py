"""``sampling=planned`` plans from the count each run may use, and only once it has it (issue 62, item 5).

uedp-bounded counts no units of its own: the number of its training users is public under its substitution
adjacency (the attribution graph is), and it is what the run divides by, so the planner splits the budget over
it. The pre-flight of ``uedp sweep`` and ``uedp demo`` runs before any data is read: a DP count is not drawn yet
and uedp-bounded's users are not read yet, so it skips planning those splits and says so, while a declared
count is planned (and refused when no split fits) as before."""

from __future__ import annotations

from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from uedp.detection.pipeline import DetectorConfig
from uedp.errors import UedpError
from uedp.flows.demo import DEMO_CORPUS
from uedp.services.config import TrainConfig
from uedp.services.demo_config import DemoConfig
from uedp.services.detect import detect_entities
from uedp.services.launch import check_before_training, preflight_sweep
from uedp.services.sweep_config import SweepConfig
from uedp.services.training_plan import PublicFacts, plan_training, preflight_plan
from uedp.storage.home import DataHome
from uedp.storage.ingest import IngestOptions, ingest

# Budget 20 rounds x q_user 0.2 x N users: the planner's largest cohort is q_user 0.4 (over 10 rounds, the least
# it takes), and the next candidate (0.28 N users) is below 10 users a round for the demo's 32: one candidate.
PLANNED: dict[str, Any] = dict(rounds=20, q_user=0.2, target_epsilon=8.0, sampling="planned")


@pytest.mark.slow
def test_uedp_bounded_trains_logs_and_says_the_planners_split_of_its_training_users(home: DataHome) -> None:
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    config = TrainConfig(dataset="demo", mechanism="uedp-bounded", holders_per_entity=0, local_update="gradient",
                         checkpoint_every=0, threads=1, **PLANNED)
    said: list[str] = []
    from uedp.services.training import train_configuration

    result = train_configuration(home, config, progress=False, report_to=said.append)
    assert result.settings["q_user"] == pytest.approx(0.4) and result.settings["rounds"] == result.rounds == 10
    assert any("sampling planned: q_user 0.4 and 10 rounds chosen" in line for line in said), said
    params = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(result.run_id).data.params
    assert params["sampling"] == "planned"  # logged "planned": and it ran the planned split
    assert float(params["q_user"]) == pytest.approx(0.4) and params["rounds"] == "10"
    assert result.epsilon <= 8.0 + 1e-6


def test_a_planned_configuration_without_a_count_to_plan_from_is_refused_not_trained_as_given() -> None:
    config = TrainConfig(dataset="d", mechanism="uedp-bounded", holders_per_entity=0, **PLANNED)
    with pytest.raises(UedpError, match="no count of users to plan from"):
        plan_training(config, PublicFacts())  # no training users: a plan would keep the given split


def test_the_preflight_skips_a_split_of_a_count_not_known_yet_and_says_so(home: DataHome) -> None:
    """`uedp sweep` (preflight_sweep) and `uedp demo` (check_before_training) on a planned userdp run with a
    DP count: refused before, blaming the dataset, for a placeholder count of 1."""
    demo = DemoConfig(home=str(home.root), mechanisms=["userdp"], **PLANNED)
    said = check_before_training(demo.train_configs(), "cpu")  # was refused: "no split ... of this dataset"
    assert len(said) == 1 and "DP count of users" in said[0] and "not plan it" in said[0]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    sweep = SweepConfig(home=str(home.root), dataset="demo", mechanisms=["userdp", "uedp-bounded"],
                        target_epsilons=[8.0], rounds=20, q_user=0.2, sampling="planned")
    heard: list[str] = []
    assert len(preflight_sweep(home, sweep, say=heard.append)) == 2 and heard == said
    bounded = TrainConfig(dataset="demo", mechanism="uedp-bounded", **PLANNED)
    assert preflight_plan(bounded) is None  # its training users are read with the data


def test_the_preflight_still_plans_a_declared_count_and_refuses_a_budget_with_no_split() -> None:
    config = TrainConfig(dataset="not-ingested", mechanism="userdp", rounds=20, q_user=0.6, target_epsilon=8.0,
                         sampling="planned", public_count=60, accountant="rdp")
    plan = preflight_plan(config)
    assert plan is not None and plan.said and plan.said[0].startswith("sampling planned: ")
    planned = plan.config.params
    assert (planned.q_user, planned.rounds) != (0.6, 20) and plan.epsilon <= 8.0  # type: ignore[attr-defined]
    assert check_before_training([config], "cpu") == []  # planned, nothing skipped
    small = config.model_copy(update={"params": config.params.model_copy(update={"rounds": 10, "q_user": 0.1})})
    with pytest.raises(UedpError, match="no split of this configuration's budget"):
        check_before_training([small], "cpu")
