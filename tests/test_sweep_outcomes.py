"""A sweep's failures, progress lines and parent run (``services.sweep``), on their own.

The flow tests run whole sweeps; these pin what a sweep says and releases when a configuration fails:
the curator reads the cause, MLflow gets only what reads no data (a crash's message could quote a
sentence), progress lines count and estimate in a form a log file keeps, and the parent run ends failed
with the tally and ``failures.json``.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from uedp.errors import UedpError
from uedp.services import sweep as sweep_module
from uedp.services.sweep import Failure, SweepFailed, SweepOutcome, SweepProgress, SweepRun
from uedp.services.sweep_config import SweepConfig
from uedp.services.tracking import tracking_uri
from uedp.services.training import TrainResult
from uedp.storage.home import DataHome

PRIVATE_SENTENCE = "Alice Smith of 12 Harbour Road owes 300 pounds"


def _result(epsilon: float = 2.0, test: float = 41.25) -> TrainResult:
    return TrainResult(run_id="a" * 32, mechanism="dpsgd", categories=[], epsilon=epsilon, delta=1e-5,
                       noise_multiplier=1.1, utility_metric="perplexity", utility_valid=40.0, utility_test=test,
                       rounds=3)


def _sweep(**extra: object) -> SweepConfig:
    return SweepConfig(dataset="demo", mechanisms=["noiseless", "dpsgd"], target_epsilons=[2.0, 8.0], model="lstm",
                       **extra)  # type: ignore[arg-type]


def test_a_crash_is_named_by_its_type_only_and_never_quotes_its_message() -> None:
    failure = Failure.of("dpsgd-eps2-s0", KeyError(PRIVATE_SENTENCE))
    assert failure.cause == "KeyError (see the flow run's log)" and not failure.configuration_error
    assert PRIVATE_SENTENCE not in failure.describe() and PRIVATE_SENTENCE not in json.dumps(failure.released())
    assert failure.released() == {"configuration": "dpsgd-eps2-s0", "kind": "crash"}
    assert failure.describe().endswith("(rerun to resume from its checkpoint)")


def test_uedps_own_error_is_a_configuration_error_with_its_first_line_as_cause() -> None:
    failure = Failure.of("uedp-eps8-s0", UedpError("target epsilon 0.01 is out of reach\nthe details that follow"))
    assert failure.configuration_error and failure.cause == "target epsilon 0.01 is out of reach"
    assert failure.released() == {"configuration": "uedp-eps8-s0", "kind": "configuration error"}
    assert failure.describe() == "uedp-eps8-s0: target epsilon 0.01 is out of reach (fix the setting)"


def test_an_empty_error_and_a_missing_one_still_name_something() -> None:
    assert Failure.of("x", UedpError("")).cause == "UedpError"
    assert Failure.of("x", None).cause == "crashed (see the flow run's log)"


def test_a_failed_sweep_says_how_many_failed_and_survives_pickling_with_what_finished() -> None:
    outcome = SweepOutcome("b" * 32, [_result()], [Failure.of("uedp-s0", ValueError("boom"))], ["report.md"])
    error = SweepFailed(outcome, total=4)
    assert str(error).startswith("1 of 4 configurations failed: uedp-s0: ValueError (see the flow run's log)")
    assert str(error).endswith(f"(the others are in MLflow run {'b' * 32})")
    again = pickle.loads(pickle.dumps(error))  # Prefect persists a failed flow's exception
    assert isinstance(again, SweepFailed) and again.total == 4 and again.outcome == outcome and str(again) == str(error)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_count_time_and_estimate_what_is_left_from_finished_configurations_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(sweep_module.time, "monotonic", clock)
    items = _sweep().items()
    assert len(items) == 3  # noiseless once, dpsgd at each target epsilon
    lines: list[str] = []
    progress = SweepProgress(len(items), lines.append)

    progress.reused(1, items[0], _result(float("inf"), 50.0))
    progress.starting(2, items[1])
    clock.now += 90
    progress.ended_with(2, items[1], _result(2.0, 41.25), None)
    progress.starting(3, items[2])
    clock.now += 5
    progress.ended_with(3, items[2], None, Failure.of(items[2].config.run_name(), UedpError("out of reach")))

    name = items[1].config.run_name()
    assert lines[0].startswith(f"[1/3] {items[0].config.run_name()}: finished before (MLflow run {'a' * 32})")
    assert lines[0].endswith("not trained again: no guarantee, test perplexity 50")
    assert lines[1] == f"[2/3] {name} (target epsilon 2): training"
    # one configuration left, estimated from the one that trained (the reused one took no time)
    assert lines[2] == f"[2/3] {name}: epsilon 2, test perplexity 41.25 (1m30s, about 1m30s left)"
    assert lines[4] == f"[3/3] FAILED {items[2].config.run_name()}: out of reach (fix the setting) (5s)"
    assert all("\n" not in line and "\r" not in line for line in lines)  # one line each, as a log file keeps it


def test_the_parent_run_ends_failed_with_the_tally_and_the_released_causes_only(home: DataHome) -> None:
    config = _sweep()
    items = config.items()
    run = SweepRun.open(home, config, items, flow_run_id="flow-1")
    run.record(items[0], _result(float("inf")))
    run.record(items[1], _result())
    run.record(items[2], None, Failure.of(items[2].config.run_name(), RuntimeError(PRIVATE_SENTENCE)))
    with pytest.raises(SweepFailed) as raised:
        run.finish(["report.md"])
    assert [r.run_id for r in raised.value.outcome.runs] == ["a" * 32] * 2

    client = MlflowClient(tracking_uri=tracking_uri(home))
    parent = client.get_run(run.run_id)
    assert parent.info.status == "FAILED"
    assert parent.data.metrics == {"configurations_failed": 1.0, "configurations_finished": 2.0}
    assert parent.data.params["mechanisms"] == "noiseless,dpsgd"
    assert parent.data.params["configurations"] == "3" and parent.data.params["noise_multiplier"] == "calibrated"
    assert parent.data.tags["uedp.kind"] == "sweep" and parent.data.tags["uedp.flow_run_id"] == "flow-1"
    assert parent.data.tags["uedp.failures"] == f"{items[2].config.run_name()}: crash"
    released = Path(client.download_artifacts(run.run_id, "failures.json", str(home.root)))
    assert json.loads(released.read_text()) == [{"configuration": items[2].config.run_name(), "kind": "crash"}]
    everything = json.dumps([parent.data.params, parent.data.tags]) + released.read_text()
    assert PRIVATE_SENTENCE not in everything


def test_a_sweep_without_failures_ends_finished_and_returns_its_runs(home: DataHome) -> None:
    config = SweepConfig(dataset="demo", mechanisms=["noiseless"], model="lstm")  # type: ignore[call-arg]
    items = config.items()
    run = SweepRun.open(home, config, items, flow_run_id="flow-2")
    run.record(items[0], _result(float("inf")))
    outcome = run.finish([])
    parent = MlflowClient(tracking_uri=tracking_uri(home)).get_run(run.run_id)
    assert parent.info.status == "FINISHED" and "uedp.failures" not in parent.data.tags
    assert outcome.failures == [] and len(outcome.runs) == 1
    assert parent.data.params["target_epsilons"] == "none" and parent.data.params["grid"] == "none"
