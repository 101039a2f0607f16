"""The typed configuration and the registry it is built from: one default per parameter, the flat and
nested forms, the sweep's base plus grid, and the CLI options derived from the models (--config, --set)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from uedp.cli import app
from uedp.options import merged, parse_sets
from uedp.privacy.mechanisms import registry
from uedp.privacy.mechanisms.params import UeDpParams, UserDpParams
from uedp.privacy.mechanisms.registry import MechanismSpec, register
from uedp.tasks.config import MechanismSettings, TrainConfig
from uedp.tasks.sweep import SweepConfig

runner = CliRunner()


def test_every_mechanism_is_registered_with_a_params_model_that_admits_its_name() -> None:
    specs = registry.mechanisms()
    builtin = ["noiseless", "deid", "dpsgd", "selective", "userdp", "uedp", "uedp-naive", "custext", "santext"]
    assert [name for name in specs if name in builtin] == builtin  # listed baselines first, then by unit
    for name, spec in specs.items():
        assert spec.default_params(**({"embeddings": "v.txt", "epsilon": 1.0} if spec.guarantee == "local" else {})
                                   ).mechanism == name
        assert spec.private == (spec.guarantee != "none")
        assert set(spec.audited_levels) <= {"sentence", "user", "entity"}


def test_a_parameter_shared_by_several_mechanisms_has_one_default_and_one_type() -> None:
    seen: dict[str, tuple[object, object]] = {}
    for spec in registry.mechanisms().values():
        for name, info in spec.params.model_fields.items():
            if name == "mechanism":
                continue
            found = (info.annotation, info.get_default(call_default_factory=True))
            assert seen.setdefault(name, found) == found, f"{name} differs in {spec.name}"
    assert set(seen) == set(MechanismSettings.model_fields)


def test_registering_a_name_twice_or_one_its_params_do_not_admit_fails() -> None:
    userdp = registry.get("userdp")
    with pytest.raises(ValueError, match="registered twice"):
        register(MechanismSpec(**{**userdp.__dict__, "summary": "another"}))
    with pytest.raises(ValueError, match="does not admit 'userdp-2'"):
        register(MechanismSpec(**{**userdp.__dict__, "name": "userdp-2"}))
    with pytest.raises(ValueError, match="unknown mechanism 'nope'"):
        registry.get("nope")


def test_flat_and_nested_forms_are_the_same_configuration_and_round_trip() -> None:
    flat = TrainConfig(dataset="d", mechanism="uedp", steps=7, q_entity=0.2, categories="PER,LOC")
    nested = TrainConfig(dataset="d", categories=["PERSON", "LOC"], params={"mechanism": "uedp", "rounds": 7,
                                                                            "q_entity": 0.2})
    assert flat == nested and isinstance(flat.params, UeDpParams) and flat.params.rounds == 7
    assert TrainConfig.model_validate(flat.model_dump()) == flat
    assert flat.flat()["q_entity"] == 0.2 and flat.flat()["dataset"] == "d"
    assert flat.fingerprint() == nested.fingerprint() != TrainConfig(dataset="d", mechanism="uedp").fingerprint()


def test_a_parameter_of_another_mechanism_is_refused_naming_it() -> None:
    with pytest.raises(ValidationError, match="q_entity"):
        TrainConfig(dataset="d", mechanism="userdp", q_entity=0.2)
    with pytest.raises(ValidationError, match="weight_cap"):
        TrainConfig(dataset="d", mechanism="uedp", weight_cap=4.0)
    with pytest.raises(ValidationError, match="vectorize_users is implemented for GPT-2"):
        TrainConfig(dataset="d", mechanism="userdp", model="lstm", vectorize_users=True)


def test_for_mechanism_takes_the_settings_a_mechanism_knows() -> None:
    shared = dict(dataset="d", steps=300, rounds=5, batch_size=4, q_user=0.2, lr=0.01, checkpoint_every=0)
    userdp = TrainConfig.for_mechanism("userdp", **shared)
    dpsgd = TrainConfig.for_mechanism("dpsgd", **shared)
    assert isinstance(userdp.params, UserDpParams) and userdp.params.rounds == 5 and userdp.params.q_user == 0.2
    assert dpsgd.params.steps == 300 and dpsgd.params.batch_size == 4 and dpsgd.checkpoint_every == 0
    assert TrainConfig.for_mechanism("userdp", dataset="d", steps=9).params.rounds == 9  # steps stands in for rounds
    local = TrainConfig.for_mechanism("custext", dataset="d", target_epsilon=2.0, epsilon=None, embeddings="v.txt")
    assert local.params.epsilon == 2.0  # the sweep's target epsilon is the per-token epsilon


def test_the_sweep_is_a_base_plus_a_grid() -> None:
    sweep = SweepConfig(home="h", dataset="d", mechanisms=["noiseless", "deid", "userdp", "uedp"],
                        category_sets=[["PERSON"], ["LOC"]], target_epsilons=[2.0, 8.0], seeds=[0, 1],
                        model="gpt2", q_user=0.1, rounds=3)
    plan = sweep.plan()
    # noiseless once per seed (categories change nothing), deid per category set, private x epsilons x sets
    assert len(plan) == 2 * (1 + 2 + 2 * 2 + 2 * 2)
    private = [i for i in plan if i.config.is_private]
    assert all(i.config.params.q_user == 0.1 and i.config.params.rounds == 3 for i in private)
    assert all(i.config.params.target_epsilon == i.target and i.config.params.noise_multiplier is None
               for i in private)
    assert sweep.run.model == "gpt2" and sweep.settings.q_user == 0.1  # type: ignore[attr-defined]


def test_options_precedence_defaults_file_flags_then_set(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("q_user: 0.2\nrounds: 4\nparams:\n  q_entity: 0.3\n", encoding="utf-8")
    values = merged(config, {"rounds": 6, "clip": None}, ["q_entity=0.05", "params.local-steps=2"])
    assert values == {"q_user": 0.2, "rounds": 6, "q_entity": 0.05, "local_steps": 2}
    assert parse_sets(["categories=[PERSON, LOC]", "accountant=rdp", "vectorize_users=true"]) == {
        "categories": ["PERSON", "LOC"], "accountant": "rdp", "vectorize_users": True}


def test_every_mechanism_parameter_is_a_flag_of_train_with_its_default_in_the_help() -> None:
    result = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in MechanismSettings.model_fields:
        assert f"--{name.replace('_', '-')}" in result.stdout, name
    assert "[default: 0.5]" in result.stdout and "--set" in result.stdout and "--config" in result.stdout


def test_the_planner_reads_training_defaults_and_overrides(tmp_path: Path) -> None:
    config = tmp_path / "plan.yaml"
    config.write_text("q_user: 0.05\nrounds: 50\n", encoding="utf-8")
    base = ["epsilon", "--mechanism", "uedp", "--users", "946", "--count-public", "--config", str(config)]
    default = runner.invoke(app, base)
    assert default.exit_code == 0, default.output
    assert "after 50 rounds" in default.stdout and "z = 1 " in default.stdout
    changed = runner.invoke(app, [*base, "--set", "q_extended=0.1", "--noise-multiplier", "3"])
    assert changed.exit_code == 0 and "z = 3 " in changed.stdout and changed.stdout != default.stdout
    bad = runner.invoke(app, [*base, "--set", "q_entity=2"])
    assert bad.exit_code == 2 and "invalid q_entity" in bad.stderr
    unplanned = runner.invoke(app, ["epsilon", "--mechanism", "selective", "--users", "9"])
    assert unplanned.exit_code == 2 and "valid: dpsgd, userdp, uedp, uedp-naive" in unplanned.stderr


def test_importing_the_cli_imports_neither_prefect_nor_mlflow() -> None:
    """Prefect reads its settings at import; the CLI points it at the data home first."""
    code = "import sys, uedp.cli; print(sorted(m for m in ('prefect', 'mlflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"
