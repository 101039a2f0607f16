"""The training plan (services/training_plan.py): built before round 1 from the configuration and public
facts only, and the one place a run, the ledger, ``uedp epsilon`` and the pre-flight learn its epsilon.

The privacy tests here use real set-ups of two neighbouring datasets (one writer removed): a plan from a
declared count must not tell them apart, and the same check catches a plan that reads the exact count."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from uedp.commands import app
from uedp.detection.pipeline import DetectorConfig
from uedp.errors import UedpError
from uedp.flows.demo import DEMO_CORPUS
from uedp.models.parallel import Ranks
from uedp.privacy.mechanisms import registry
from uedp.privacy.population import Population
from uedp.services import training_setup
from uedp.services.config import TrainConfig
from uedp.services.detect import detect_entities
from uedp.services.training_plan import PublicFacts, TrainingPlan, plan_training, preflight_plan
from uedp.storage.home import DataHome
from uedp.storage.ingest import IngestOptions, ingest

from support import write

TINY: dict[str, Any] = dict(checkpoint_every=0, threads=1, seed=3, randomness="seeded")


@pytest.fixture
def neighbours(home: DataHome, tmp_path: Path) -> DataHome:
    """``full``: the demo corpus; ``less``: the same corpus without its last document (one writer)."""
    documents = DEMO_CORPUS.read_text(encoding="utf-8").split("-DOCSTART-")
    less = write(tmp_path / "less.conll", "-DOCSTART-".join(documents[:-1]))
    for name, path in (("full", DEMO_CORPUS), ("less", less)):
        ingest(home, name, [path], IngestOptions(format="conll2003"))
        detect_entities(home, name, DetectorConfig(detectors=["gold"]))
    return home


def _plan_of(home: DataHome, dataset: str, mechanism: str, **settings: Any) -> TrainingPlan:
    config = TrainConfig(dataset=dataset, mechanism=mechanism, **TINY, **settings)
    return training_setup.set_up(home, config, Ranks.current()).plan


def _what_it_releases(plan: TrainingPlan) -> dict[str, Any]:
    """Everything a plan hands on: to the ledger, the run's parameters, the terminal and the log."""
    return {"epsilon": plan.epsilon, "delta": plan.delta, "unit": plan.unit,
            "z": getattr(plan.mechanism, "noise_multiplier", None), "config": plan.config.model_dump(),
            "signal": plan.noise_to_signal.ratio if plan.noise_to_signal else None,
            "warning": plan.noise_warning, "said": plan.said, "warnings": plan.warnings}


PUBLIC_COUNT = {"userdp": dict(rounds=3, q_user=0.3, public_count=200, target_epsilon=4.0),
                "uedp": dict(rounds=3, q_user=0.3, q_entity=0.3, public_count=200, noise_multiplier=3.0),
                "dpsgd": dict(steps=3, public_count=5000, target_epsilon=4.0)}


def _differences(home: DataHome, mechanism: str, **settings: Any) -> list[str]:
    """What a plan of ``full`` releases that the same plan of ``less`` releases otherwise."""
    full, less = (_what_it_releases(_plan_of(home, name, mechanism, **settings)) for name in ("full", "less"))
    full["config"].pop("dataset"), less["config"].pop("dataset")
    return sorted(key for key in full if full[key] != less[key])


@pytest.mark.parametrize("mechanism", sorted(PUBLIC_COUNT))
def test_a_plan_from_a_declared_count_does_not_tell_neighbouring_datasets_apart(neighbours: DataHome,
                                                                                mechanism: str) -> None:
    plan = _plan_of(neighbours, "full", mechanism, **PUBLIC_COUNT[mechanism])
    assert math.isfinite(plan.epsilon) and plan.epsilon > 0 and plan.unit == registry.get(mechanism).unit
    assert _differences(neighbours, mechanism, **PUBLIC_COUNT[mechanism]) == []


def test_the_neighbour_check_catches_a_plan_that_reads_the_exact_count(neighbours: DataHome,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberately broken set-up that plans from the exact number of users: the same check fails."""
    def exact(config: TrainConfig, exact_units: int, *args: Any, **kwargs: Any) -> Population:
        return Population.declared(exact_units)

    monkeypatch.setattr(training_setup, "unit_population", exact)
    assert "signal" in _differences(neighbours, "userdp", rounds=3, q_user=0.3, target_epsilon=4.0)


def test_the_plan_holds_the_configuration_it_trains_and_its_epsilon_is_the_runs(neighbours: DataHome) -> None:
    """sampling=planned: the plan's configuration has the planner's split, and says so before training;
    the plan's epsilon is what the mechanism states when it trains to the end."""
    plan = _plan_of(neighbours, "full", "userdp", rounds=40, q_user=0.3, target_epsilon=4.0, sampling="planned",
                    public_count=400)
    assert plan.said and plan.said[0].startswith("sampling planned: ")
    assert plan.config.params != TrainConfig(dataset="full", mechanism="userdp", rounds=40, q_user=0.3,
                                             target_epsilon=4.0, sampling="planned").params
    assert plan.epsilon == pytest.approx(4.0, rel=1e-3)
    assert plan.mechanism.planned_epsilon() == plan.epsilon


def test_a_plan_without_a_guarantee_spends_nothing() -> None:
    noiseless = plan_training(TrainConfig(dataset="d", mechanism="noiseless"), PublicFacts())
    assert noiseless.epsilon == math.inf and noiseless.delta == 0.0 and noiseless.noise_to_signal is None


def test_the_preflight_plans_before_any_data_and_refuses_a_target_out_of_reach() -> None:
    config = TrainConfig(dataset="not-ingested", mechanism="userdp", rounds=5, q_user=0.2, target_epsilon=4.0)
    plan = preflight_plan(config)
    assert 3.9 < plan.epsilon <= 4.0 and plan.noise_to_signal is None  # the count is not drawn: no signal yet
    with pytest.raises(UedpError, match="userdp"):
        preflight_plan(config.model_copy(update={"params": config.params.model_copy(update={"target_epsilon": 1e-4})}))


PLANNED = [name for name, spec in registry.mechanisms().items() if spec.quote is not None]


@pytest.mark.parametrize("mechanism", PLANNED)
def test_uedp_epsilon_prints_the_plans_epsilon(mechanism: str) -> None:
    """`uedp epsilon` reads the same plan training reads: its figure is the plan's, for every planner."""
    settings = ["--noise-multiplier", "2", "--rounds" if "rounds" in registry.get(mechanism).params.model_fields
                else "--steps", "20"]
    result = CliRunner().invoke(app, ["epsilon", "--mechanism", mechanism, "--users", "500", "--count-public",
                                      *settings])
    assert result.exit_code == 0, result.output
    printed = float(re.search(r"epsilon = ([0-9.e+-]+)", result.stdout).group(1))  # type: ignore[union-attr]
    values: dict[str, Any] = {"noise_multiplier": 2.0}
    values["rounds" if "rounds" in registry.get(mechanism).params.model_fields else "steps"] = 20
    config = TrainConfig(dataset="plan", mechanism=mechanism, **values)
    plan = plan_training(config, PublicFacts(Population.declared(500), n_examples=500, train_users=500))
    assert printed == float(f"{plan.epsilon:.4g}")
