"""The user's path: `uedp demo` through the real CLI, a real Prefect server and a real MLflow store;
and bad input answered with one line and exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.cli import app

runner = CliRunner()


@pytest.mark.slow
def test_demo_end_to_end_logs_runs_and_reuses_data_on_rerun(tmp_path: Path, prefect_server: None) -> None:
    home = tmp_path / "home"
    args = ["demo", "--home", str(home), "--steps", "60", "--rounds", "3", "--mechanisms", "noiseless,userdp"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "ingested dataset 'demo'" in first.stdout
    assert f"mlflow ui --backend-store-uri sqlite:///{home / 'mlflow.db'}" in first.stdout

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("demo")
    runs = {r.data.params["mechanism"]: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"noiseless", "userdp"}
    for run in runs.values():
        assert run.info.status == "FINISHED"
        for param in ("mechanism", "categories", "model", "seed", "privacy_unit"):
            assert param in run.data.params
    # Each run logs its own mechanism's parameters, not every mechanism's.
    assert {"q_user", "noise_multiplier", "clip", "delta", "rounds"} <= set(runs["userdp"].data.params)
    assert {"steps", "lr"} <= set(runs["noiseless"].data.params) and "q_user" not in runs["noiseless"].data.params
    for run in runs.values():
        assert run.data.params["categories"] == "EMAIL_ADDRESS,LOC,ORG,PERSON,PHONE_NUMBER"
        assert run.data.metrics["perplexity"] > 1
        # no entity text anywhere in params or tags
        logged = " ".join(list(run.data.params.values()) + list(run.data.tags.values()))
        assert "Okafor" not in logged and "+44" not in logged

    private = runs["userdp"]
    epsilons = client.get_metric_history(private.info.run_id, "epsilon")
    assert [m.step for m in epsilons] == [1, 2, 3]
    assert epsilons[0].value < epsilons[-1].value
    assert private.data.params["noise_multiplier_used"] == "1.0"
    artifacts = {a.path for a in client.list_artifacts(private.info.run_id)}
    assert {"epsilon_per_round.png", "resolved_config.json"} <= artifacts

    noiseless = client.get_metric_history(runs["noiseless"].info.run_id, "perplexity_valid")
    assert noiseless[0].step == 0 and noiseless[-1].value < 0.5 * noiseless[0].value  # it learned

    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "reused existing dataset 'demo'" in second.stdout and "nothing redone" in second.stdout
    assert "reused" in second.stdout.split("detect:")[1].splitlines()[0]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--categories", "PER,FOO"], "unknown entity categories FOO; valid: PERSON,NORP,"),
        (["--mechanisms", "noiseless,magic"], "invalid mechanisms.1"),
        (["--q-user", "1.5"], "invalid q_user"),
        (["--device", "tpu:9"], "invalid device"),
        (["--target-epsilon", "1e9"], "met even with noise multiplier"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path: Path, extra: list[str], message: str) -> None:
    result = runner.invoke(app, ["demo", "--home", str(tmp_path / "h"), *extra])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["entities", "demo", "--categories", "FOO"], "unknown entity categories FOO"),
        (["entities", "nosuch"], "dataset 'nosuch' has no sentences table"),
        (["detect", "demo", "--detector", "spacy"], "need a spaCy pipeline"),
        (["detect", "nosuch"], "dataset 'nosuch' has no sentences table"),
        (["ingest", "conll2003", "missing.conll", "--name", "x"], "missing.conll: file not found"),
        (["ingest", "ag_news", "x.csv", "--name", "x", "--users", "column"], "ag_news users"),
        (["ingest", "conll2003", "x.conll", "--name", "bad/name"], "invalid dataset name"),
    ],
)
def test_other_commands_reject_bad_input_with_exit_code_2(tmp_path: Path, args: list[str], message: str,
                                                          prefect_server: None) -> None:
    result = runner.invoke(app, [*args, "--home", str(tmp_path / "h")])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1].startswith("error: ") and message in result.stderr


def test_home_that_is_a_file_is_rejected(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = runner.invoke(app, ["demo", "--home", str(blocker)])
    assert result.exit_code == 2 and "is not a folder" in result.stderr


def test_help_answers_for_every_command() -> None:
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0 and "demo" in top.stdout
    demo = runner.invoke(app, ["demo", "--help"])
    assert demo.exit_code == 0 and "--target-epsilon" in demo.stdout and "--categories" in demo.stdout
    for command, option in (("ingest", "--users"), ("detect", "--spacy-model"), ("entities", "--coverage"),
                            ("datasets", "--home")):
        result = runner.invoke(app, [command, "--help"])
        assert result.exit_code == 0 and option in result.stdout, command


def test_the_demo_says_each_step_as_it_happens(tmp_path: Path, prefect_server: None, capsys) -> None:  # type: ignore[no-untyped-def]
    """Issue 68, 9: `uedp demo` was silent for minutes between detection and its table (the trainings'
    progress went to the flow run's log only). Each step and each training's progress now reach stderr."""
    from uedp.flows.demo import demo_flow
    from uedp.services.demo_config import DemoConfig

    config = DemoConfig(home=str(tmp_path / "h"), mechanisms=["noiseless", "deid"], steps=3)
    outcome = demo_flow(config, progress=True)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(("ingest:", "detect:", "[", "train "))]
    assert lines[0].startswith("ingest: ") and lines[1].startswith("detect: ")
    assert any(line.startswith("[1/2] noiseless") for line in lines) and any(line.startswith("[2/2] deid") for line in lines)
    assert any(line.startswith("train ") and "3/3 steps" in line for line in lines)  # a training's own progress
    assert any(line.startswith("train ") and ": scoring the model on " in line for line in lines)  # not minutes of silence
    assert len(outcome.runs) == 2
