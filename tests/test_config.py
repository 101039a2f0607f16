"""The typed configuration and the registry it is built from: one default per parameter, the flat and
nested forms, the sweep's base plus grid, and the CLI options derived from the models (--config, --set)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from uedp.cli import app
from uedp.options import merged, parse_sets
from uedp.privacy.mechanisms import registry
from uedp.privacy.mechanisms.params import UeDpParams, UserDpParams
from uedp.privacy.mechanisms.registry import MechanismSpec, register
from uedp.services.config import MechanismSettings, TrainConfig
from uedp.services.sweep_config import SweepConfig

runner = CliRunner()


def uedp(*args: str) -> Any:
    """The CLI in process (typer's runner; conftest sets Prefect's logging up before any command imports it)."""
    return CliRunner().invoke(app, list(args))


def test_every_mechanism_is_registered_with_a_params_model_that_admits_its_name() -> None:
    specs = registry.mechanisms()
    builtin = ["noiseless", "deid", "dpsgd", "selective", "userdp", "uedp", "uedp-naive", "custext", "santext"]
    assert [name for name in specs if name in builtin] == builtin  # listed baselines first, then by unit
    for name, spec in specs.items():
        assert spec.default_params(**({"embeddings": "v.txt", "epsilon": 1.0} if spec.guarantee == "local" else {})
                                   ).mechanism == name
        assert spec.private == (spec.guarantee != "none")


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
    plan = sweep.items()
    # per seed: noiseless once (categories change nothing), deid per category set, userdp once per epsilon
    # (its training ignores categories), uedp per epsilon and category set
    assert len(plan) == 2 * (1 + 2 + 2 + 2 * 2)
    assert sorted(i.config.mechanism for i in plan if i.config.seed == 0) == \
        ["deid", "deid", "noiseless", "uedp", "uedp", "uedp", "uedp", "userdp", "userdp"]
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


def test_importing_the_cli_imports_neither_prefect_nor_mlflow_nor_the_heavy_training_libraries() -> None:
    """Prefect reads its settings at import; the CLI points it at the data home first. Opacus and
    transformers load when a command trains, so `uedp --help` and `uedp datasets` stay quick."""
    code = ("import sys, uedp.cli; "
            "print(sorted(m for m in ('prefect', 'mlflow', 'opacus', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"


def test_a_logged_configuration_feeds_back_with_config_and_the_named_dataset_wins(tmp_path: Path) -> None:
    logged = TrainConfig(dataset="elsewhere", mechanism="userdp", rounds=3, q_user=0.2)
    resolved = tmp_path / "resolved_config.json"
    resolved.write_text(json.dumps({"config": logged.model_dump(), "privacy": {}}), encoding="utf-8")
    result = uedp("train", "missing", "--home", str(tmp_path / "home"), "--config", str(resolved), "--set", "seed=1")
    assert result.exit_code == 2, result.stderr  # one line naming the dataset given, not a TypeError
    assert "missing" in result.stderr and "elsewhere" not in result.stderr and len(result.stderr.splitlines()) == 1


def test_local_dp_takes_its_epsilon_from_target_epsilon_on_the_command_line(tmp_path: Path) -> None:
    result = uedp("train", "missing", "--home", str(tmp_path), "--mechanism", "custext", "--target-epsilon", "2",
                  "--embeddings", "v.txt")
    assert result.exit_code == 2 and "noise_multiplier" not in result.stderr and "missing" in result.stderr
    config = TrainConfig(dataset="d", mechanism="custext", target_epsilon=2.0, embeddings="v.txt")
    assert config.params.epsilon == 2.0 and config.params.budget == 2.0


def test_a_target_epsilon_replaces_the_default_noise_multiplier() -> None:
    config = TrainConfig(dataset="d", mechanism="userdp", target_epsilon=4.0)
    assert config.params.noise_multiplier is None and config.params.budget == 4.0


def test_the_planner_refuses_a_parameter_its_mechanism_does_not_take() -> None:
    result = runner.invoke(app, ["epsilon", "--mechanism", "dpsgd", "--users", "100", "--rounds", "5"])
    assert result.exit_code == 2 and "invalid rounds" in result.stderr


def test_grid_epsilons_replace_a_budget_in_the_base() -> None:
    sweep = SweepConfig(home="h", dataset="d", mechanisms=["custext", "userdp"], target_epsilons=[1.0, 8.0],
                        embeddings="v.txt", epsilon=3.0, target_epsilon=5.0)
    assert sorted((i.config.mechanism, i.config.params.budget, i.target) for i in sweep.items()) == [
        ("custext", 1.0, 1.0), ("custext", 8.0, 8.0), ("userdp", 1.0, 1.0), ("userdp", 8.0, 8.0)]
    based = SweepConfig(home="h", dataset="d", mechanisms=["userdp"], target_epsilon=5.0)
    assert [i.target for i in based.items()] == [5.0]  # a budget in the base is still what the run reaches


def test_runs_logged_before_the_nested_configuration_still_load() -> None:
    """``uedp attack`` reads old runs' flat resolved_config.json (every mechanism's fields, local_dp block)."""
    flat = {"dataset": "d", "mechanism": "uedp", "steps": 7, "q_user": 0.2, "q_entity": 0.3, "lr": 0.001,
            "batch_size": 16, "public_steps": 300, "hidden_clip": 1.0, "noise_multiplier": 1.0,
            "target_epsilon": None, "local_dp": None, "categories": ["PERSON"], "model": "gpt2"}
    config = TrainConfig.from_logged(flat)
    assert config.params.rounds == 7 and config.params.q_entity == 0.3 and config.categories == ["PERSON"]
    local = TrainConfig.from_logged({"dataset": "d", "mechanism": "custext", "steps": 5, "target_epsilon": 2.0,
                                     "noise_multiplier": None, "q_user": 0.5,
                                     "local_dp": {"embeddings": "v.txt", "k": 10, "strategy": "token"}})
    assert local.params.epsilon == 2.0 and local.params.k == 10 and local.params.steps == 5
    assert TrainConfig.from_logged(config.model_dump()) == config


@pytest.mark.parametrize("name", sorted(registry.names()))
def test_every_mechanisms_parameters_answer_what_services_ask(name: str) -> None:
    """The facts services read instead of a field by name (tests/test_architecture.py refuses getattr on
    parameters outside privacy/): each agrees with the fields it stands for."""
    spec = registry.get(name)
    needs = {"embeddings": "vectors.txt", "target_epsilon": 2.0} if spec.guarantee == "local" else {}
    params = spec.default_params(**needs)
    fields = type(params).model_fields
    assert params.stated_delta == (params.delta if spec.private and "delta" in fields else None)  # type: ignore[attr-defined]
    assert params.clip_bound == (params.clip if "clip" in fields else None)  # type: ignore[attr-defined]
    assert params.plans_sampling == (getattr(params, "sampling", "fixed") == "planned")
    assert params.vectorizes_users == getattr(params, "vectorize_users", False)
    length = params.length()
    assert length is not None and length[0] in ("steps", "rounds") and length[1] == length[2] == fields[length[0]].default
    longer = params.model_copy(update={length[0]: length[1] + 7})
    assert longer.length() == (length[0], length[1] + 7, length[2])
    assert params.holds({}) and params.holds({length[0]: length[1]}) and not params.holds({length[0]: length[1] + 1})
    assert not params.holds({"no_such_parameter": 1})
    from uedp.privacy.sanitization.choices import LOCAL_DP_FACTS

    assert spec.unit == (LOCAL_DP_FACTS[name].unit if spec.guarantee == "local" else type(params).unit_words)


@pytest.mark.parametrize(("mechanism", "extra", "recorded"), [
    ("userdp", {}, "c401f34637bfcd8a"),
    ("uedp", {"categories": ["PERSON"]}, "7b1482885b36492a"),
    ("uedp-bounded", {"categories": ["PERSON"]}, "a690177820db298f"),
    ("userdp", {"local_update": "gradient", "q_user": 0.1, "rounds": 20}, "14e62e077b1c231c"),
])
def test_a_setting_added_later_leaves_earlier_configurations_fingerprints_as_they_were(
        mechanism: str, extra: dict, recorded: str) -> None:
    """The fingerprints uedp gave these configurations before ``user_text`` existed (at 4c52a98): a finished run
    is found again and a checkpoint resumes by it, so a new setting at its as-before value must not move it;
    any other value makes another configuration."""
    config = TrainConfig(dataset="conll", mechanism=mechanism, noise_multiplier=1.0, **extra)
    assert config.fingerprint() == recorded
    chunked = TrainConfig(dataset="conll", mechanism=mechanism, noise_multiplier=1.0, user_text="chunks", **extra)
    assert chunked.fingerprint() != recorded
