"""One rule per setting: the rules that tie two settings together (a noise multiplier or a target epsilon,
a parameter under one of its names) are stated once, in the parameters models, and every front end reads
them from there: the parameter texts (``--help``, the Prefect form, the docs), the validators, the CLI's
errors, config files and sweeps. These tests hold each front end to the same text and the same verdict."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.utilities.callables import parameter_schema
from pydantic import ValidationError
from typer.testing import CliRunner

from uedp.commands import app
from uedp.privacy.mechanisms import registry
from uedp.privacy.mechanisms.params import NOISE_OR_TARGET, PrivateParams, names_of, one_name_only
from uedp.services.config import MechanismSettings, TrainConfig
from uedp.services.sweep_config import SweepConfig

runner = CliRunner()
PRIVATE = [name for name, spec in registry.mechanisms().items() if issubclass(spec.params, PrivateParams)]
ALIASED = [(name, field, names) for name, spec in registry.mechanisms().items()
           for field, names in names_of(spec.params).items() if len(names) > 1]


def test_every_mechanism_with_noise_refuses_a_noise_multiplier_and_a_target_together() -> None:
    assert PRIVATE, "no mechanism with a central guarantee is registered"
    for name in PRIVATE:
        with pytest.raises(ValidationError, match=NOISE_OR_TARGET):
            TrainConfig(dataset="d", mechanism=name, noise_multiplier=2.0, target_epsilon=4.0)
        planned = TrainConfig(dataset="d", mechanism=name, target_epsilon=4.0).params
        assert planned.noise_multiplier is None  # type: ignore[attr-defined]  # z is calibrated, not defaulted
        assert TrainConfig(dataset="d", mechanism=name).params.noise_multiplier == 1.0  # type: ignore[attr-defined]


def test_the_parameter_texts_state_the_rule_the_validator_enforces() -> None:
    """The words under the flag, in the Prefect form and in cli.md are the validator's own constant."""
    for name in PRIVATE:
        fields = registry.get(name).params.model_fields
        for field in ("noise_multiplier", "target_epsilon"):
            assert NOISE_OR_TARGET in str(fields[field].description), (name, field)
    for model in (MechanismSettings, TrainConfig):
        schema = str(model.model_json_schema())
        assert "ignored when" not in schema  # the old text, which said the opposite of the validator
    from uedp.flows.sweep import sweep_flow

    form = str(parameter_schema(sweep_flow).model_dump())
    assert NOISE_OR_TARGET in form
    help_text = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "400"}).output
    assert " ".join(NOISE_OR_TARGET.split()) in " ".join(help_text.replace("│", " ").split())
    cli_md = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")
    assert NOISE_OR_TARGET in cli_md and "ignored when target_epsilon" not in cli_md


@pytest.mark.parametrize("front_end", ["flags", "config file", "--set"])
def test_the_cli_refuses_both_with_the_validators_words(front_end: str, tmp_path: Path) -> None:
    base = ["train", "demo", "--home", str(tmp_path / "home"), "--mechanism", "userdp"]
    given = {"flags": ["--noise-multiplier", "2", "--target-epsilon", "4"],
             "--set": ["--set", "noise_multiplier=2", "--set", "target_epsilon=4"]}.get(front_end)
    if given is None:
        config = tmp_path / "run.yaml"
        config.write_text("noise_multiplier: 2\ntarget_epsilon: 4\n", encoding="utf-8")
        given = ["--config", str(config)]
    result = runner.invoke(app, [*base, *given])
    assert result.exit_code == 2 and NOISE_OR_TARGET in result.stderr, result.output


def test_a_sweep_refuses_a_noise_multiplier_beside_its_target_epsilons() -> None:
    with pytest.raises(ValidationError, match=NOISE_OR_TARGET):
        SweepConfig(dataset="d", mechanisms=["userdp"], target_epsilons=[2.0], noise_multiplier=2.0)
    calibrated = SweepConfig(dataset="d", mechanisms=["userdp"], target_epsilons=[2.0]).items()
    assert [item.config.params.target_epsilon for item in calibrated] == [2.0]  # type: ignore[attr-defined]
    fixed = SweepConfig(dataset="d", mechanisms=["userdp"], noise_multiplier=2.0).items()
    assert [item.config.params.noise_multiplier for item in fixed] == [2.0]  # type: ignore[attr-defined]


def test_a_parameter_under_two_of_its_names_is_refused_everywhere_with_one_text(tmp_path: Path) -> None:
    assert ALIASED, "no parameter has an alias: the rule below tests nothing"
    for mechanism, field, names in ALIASED:
        values = {names[0]: 3, names[1]: 4} if field != "epsilon" else {names[0]: 3.0, names[1]: 4.0}
        with pytest.raises(ValidationError) as refused:
            TrainConfig(dataset="d", mechanism=mechanism, embeddings="v.txt", **values)
        assert one_name_only(mechanism, names[:2]) in str(refused.value), (mechanism, field)
    rounds = next(names for mechanism, field, names in ALIASED if mechanism == "userdp" and field == "rounds")
    result = runner.invoke(app, ["train", "demo", "--home", str(tmp_path / "home"), "--mechanism", "userdp",
                                 "--rounds", "3", "--steps", "4"])
    assert result.exit_code == 2 and one_name_only("userdp", rounds) in result.stderr, result.output


def test_shared_settings_give_each_mechanism_its_own_parameter() -> None:
    """A sweep's base holds ``steps`` as dpsgd's parameter and ``rounds`` as userdp's: not two names of one."""
    sweep = SweepConfig(dataset="d", mechanisms=["userdp", "dpsgd"], rounds=7, steps=9)
    counts = {item.config.mechanism: item.config.params.steps_run for item in sweep.items()}
    assert counts == {"userdp": 7, "dpsgd": 9}
