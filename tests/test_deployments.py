"""deployments/prefect.yaml as Prefect reads it: every entrypoint loads, every default parameter set
validates against its flow, fields are ones Prefect knows, and the UI gets choice lists."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prefect.cli.deploy._models import DeploymentConfig, PrefectYamlModel
from prefect.flows import load_flow_from_entrypoint
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools import validate

from uedp.detection.categories import taxonomy
from uedp.services.config import MechanismName

SPEC = yaml.safe_load((Path(__file__).parents[1] / "deployments" / "prefect.yaml").read_text())


def test_prefect_accepts_the_file_and_knows_every_field() -> None:
    model = PrefectYamlModel.model_validate(SPEC)
    assert {d.name for d in model.deployments} == {"uedp-ingest", "uedp-detect", "uedp-sanitize", "uedp-sweep",
                                                   "uedp-pipeline", "uedp-demo", "uedp-pretrain", "uedp-generate"}
    for deployment in SPEC["deployments"]:
        assert set(deployment) <= set(DeploymentConfig.model_fields), deployment["name"]  # no ignored typos
        assert deployment["work_pool"]["name"] in ("cpu", "gpu")
    training = [d for d in model.deployments if d.work_pool and d.work_pool.name == "gpu"]
    assert {d.name for d in training} == {"uedp-sweep", "uedp-pipeline", "uedp-pretrain", "uedp-generate"} and all(d.concurrency_limit == 1 for d in training)
    assert any(d.schedules for d in model.deployments) and all(not s.active for d in model.deployments
                                                                  for s in (d.schedules or []))


@pytest.mark.parametrize("deployment", SPEC["deployments"], ids=lambda d: d["name"])
def test_entrypoints_load_and_default_parameters_validate(deployment: dict) -> None:
    flow = load_flow_from_entrypoint(deployment["entrypoint"])
    assert flow.name == deployment["name"]
    flow.validate_parameters(deployment["parameters"])  # raises on any invalid default
    # The server enforces the JSON schema too, which knows only canonical category names (no aliases).
    schema = parameter_schema(flow).model_dump()
    errors = validate(deployment["parameters"], schema, preprocess=True)
    assert not errors, [e.message for e in errors]


def test_the_ui_form_offers_mechanisms_and_categories_as_choices() -> None:
    from uedp.flows.sweep import sweep_flow

    schema = parameter_schema(sweep_flow).model_dump()
    sweep = schema["definitions"]["SweepConfig"]["properties"]
    assert sweep["mechanisms"]["items"]["enum"] == list(MechanismName.__args__)  # type: ignore[attr-defined]
    choices = sweep["category_sets"]["items"]["items"]["enum"]
    assert "PERSON" in choices and "PII" in choices and set(taxonomy().canonical) <= set(choices)


def _fields(schema: dict) -> dict[str, dict]:
    """Every field of a flow's form, top level and nested blocks, as ``Block.field`` -> its schema."""
    out = {f"(flow).{name}": prop for name, prop in schema["properties"].items()}
    for block, definition in schema.get("definitions", {}).items():
        out |= {f"{block}.{name}": prop for name, prop in definition.get("properties", {}).items()}
    return out


@pytest.mark.parametrize("deployment", SPEC["deployments"], ids=lambda d: d["name"])
def test_every_form_field_says_what_it_is(deployment: dict) -> None:
    """The Prefect UI shows a field's description under it: none may be blank."""
    schema = parameter_schema(load_flow_from_entrypoint(deployment["entrypoint"])).model_dump()
    bare = sorted(name for name, prop in _fields(schema).items() if not prop.get("description"))
    assert not bare, f"form fields without a description: {bare}"


def test_sizes_and_devices_are_choices_and_the_budget_stop_is_in_the_form() -> None:
    from uedp.flows.sweep import sweep_flow
    from uedp.models.presets import SIZE_PRESETS

    fields = _fields(parameter_schema(sweep_flow).model_dump())
    # a choice list, or a pretrained checkpoint's folder / hub name in the form's second option
    sizes = next(option["enum"] for option in fields["RunSettings.model_size"]["anyOf"] if "enum" in option)
    assert set(sizes) == {size for presets in SIZE_PRESETS.values() for size in presets}
    devices = next(option["enum"] for option in fields["RunSettings.device"]["anyOf"] if "enum" in option)
    assert {"auto", "cpu", "cuda", "cuda:0"} <= set(devices)
    assert "max_epsilon" in {name.split(".")[1] for name in fields if name.startswith("MechanismSettings.")}
