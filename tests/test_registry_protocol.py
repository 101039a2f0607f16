"""The mechanism protocol, shown by a mechanism written here as a test fixture and nowhere else: it says the
six things every mechanism must say, does the one thing it must do (train, returning what it produced),
and the whole pipeline (configuration, set-up, the round loop, MLflow, the report) takes it from the
registry. If adding a mechanism needed an edit anywhere else, this test could not pass.

Also: the registry lists its modules explicitly, and every module that registers is listed.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import dp_accounting
import pytest
import torch
from mlflow.tracking import MlflowClient
from pydantic import Field

from uedp.detection.pipeline import DetectorConfig
from uedp.flows.demo import DEMO_CORPUS
from uedp.models.batching import collate
from uedp.privacy.accounting.rounds import RoundAccountant, shown_rounds
from uedp.privacy.mechanisms import registry
from uedp.privacy.mechanisms.base import NO_CHECKPOINT, Checkpointer, LossFn, OnRound, TrainData, Trained
from uedp.privacy.mechanisms.loop import RoundLoop, RoundOutput, planned_epsilon, private_statement
from uedp.privacy.mechanisms.params import MechanismParams
from uedp.privacy.mechanisms.registry import MechanismSpec
from uedp.privacy.primitives import gaussian_noise_like
from uedp.privacy.randomness import Randomness, RoundRandomness
from uedp.services.config import TrainConfig
from uedp.services.detect import detect_entities
from uedp.services.report import markdown, summarise
from uedp.services.training import train_configuration
from uedp.storage.ingest import IngestOptions, ingest

from support import REPO, write

TOY = "toy-full-batch"
TOY_UNIT = "one training sequence (toy: full-batch noisy clipped gradients)"


class ToyParams(MechanismParams):
    mechanism: Literal["toy-full-batch"] = "toy-full-batch"
    steps: int = Field(3, ge=1)
    clip: float = Field(1.0, gt=0)
    noise_multiplier: float = Field(2.0, gt=0)
    lr: float = Field(0.05, gt=0)
    public_size: int = Field(100, ge=1)  # the denominator, declared: the exact count would leak
    delta: float = Field(1e-5, gt=0, lt=1)
    max_epsilon: float | None = Field(None, gt=0)  # stop before a step that would exceed it

    @property
    def steps_run(self) -> int:
        return self.steps


class ToyFullBatch:
    """Every sequence, every step: clipped per-sequence gradients summed, Gaussian noise z * clip added,
    divided by a declared size. Add/remove one sequence moves the sum by at most clip."""

    name, unit = TOY, TOY_UNIT

    def __init__(self, params: ToyParams, randomness: Randomness):
        self.params, self.randomness = params, randomness

    def run_accountant(self) -> RoundAccountant:
        p = self.params
        return RoundAccountant(dp_accounting.GaussianDpEvent(p.noise_multiplier), p.delta, "pld", "add_remove")

    def planned_epsilon(self) -> float:
        """What a mechanism with a guarantee must say before round 1: the privacy ledger reserves it."""
        return planned_epsilon(self.run_accountant(), self.params.steps, self.params.max_epsilon)

    def noise_to_signal(self, units: float) -> None:
        """The other question the training plan asks: None, no warning about an averaged update's noise."""
        return None

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT) -> Trained:
        p = self.params
        accountant = self.run_accountant()
        params = [q for q in model.parameters() if q.requires_grad]

        def one_step(_: int, rng: RoundRandomness) -> RoundOutput:
            total = [torch.zeros_like(q) for q in params]
            for sequence in data.sequences:
                model.zero_grad(set_to_none=True)
                loss_fn(model, collate([sequence], data.pad_id)).backward()
                grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
                norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
                for t, g in zip(total, grads):
                    t.add_(g * min(1.0, p.clip / (float(norm) + 1e-12)))
            noise = gaussian_noise_like(total, p.noise_multiplier * p.clip, rng.stream("noise"))
            with torch.no_grad():
                for q, t, n in zip(params, total, noise):
                    q.sub_(p.lr * (t + n) / p.public_size)
            return RoundOutput()

        loop = RoundLoop(self.name, p.steps, accountant, self.randomness, p.delta, p.max_epsilon, "step",
                         state={"model": model})
        model.train()
        outcome = loop.run(one_step, on_round, checkpoint)
        return Trained(private_statement(
            self.name, self.unit, accountant, outcome, delta=p.delta, accountant="pld",
            noise_multiplier=p.noise_multiplier, sampling_probability=1.0, randomness=self.randomness,
            population=None, extra={"noise_std": p.noise_multiplier * p.clip}))


@pytest.fixture
def toy() -> Iterator[MechanismSpec]:
    spec = registry.register(MechanismSpec(
        name=TOY, summary="a test fixture: full-batch DP gradient descent", params=ToyParams, unit=TOY_UNIT,
        guarantee="central", build=lambda params, context: ToyFullBatch(params, context.randomness),
        per_example_loss=True))
    yield spec
    registry.unregister(TOY)


def test_a_mechanism_registered_by_a_fixture_trains_end_to_end_from_the_registry(home, toy: MechanismSpec) -> None:
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    config = TrainConfig(dataset="demo", mechanism=TOY, steps=3, noise_multiplier=2.0, randomness="seeded",
                         max_len=32, checkpoint_every=0)
    assert config.spec is toy and config.total_steps == 3 and config.run_name().startswith(TOY)

    result = train_configuration(home, config, progress=False)

    expected = dp_accounting.pld.PLDAccountant().compose(dp_accounting.GaussianDpEvent(2.0), 3).get_epsilon(1e-5)
    assert result.epsilon == pytest.approx(expected, rel=1e-3) and math.isfinite(result.utility_test)
    assert result.unit == TOY_UNIT and result.rounds == 3
    run = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(result.run_id)
    assert run.data.params["privacy_unit"] == TOY_UNIT and run.data.params["mechanism"] == TOY
    assert float(run.data.metrics["final_epsilon"]) == pytest.approx(result.epsilon)
    report = markdown(summarise([(result, None)]), "toy")
    assert f"- {TOY}: {TOY_UNIT}" in report  # the report's unit legend comes from the run, not a table


def test_the_logged_epsilon_curve_holds_exact_figures_only_none_above_the_final_one(home, toy: MechanismSpec,
                                                                                   tmp_path: Path) -> None:
    """A run longer than the shown rounds, stopped by its budget between two of them: MLflow's epsilon
    metric is logged at the shown rounds and the stop only, each dp_accounting's own figure."""
    blocks = DEMO_CORPUS.read_text(encoding="utf-8").split("\n\n")  # a few sentences: 76 full-batch steps
    files = [write(tmp_path / "train.conll", "\n\n".join(blocks[:8]) + "\n\n"),
             write(tmp_path / "valid.conll", "\n\n".join(blocks[:1] + blocks[8:10]) + "\n\n"),
             write(tmp_path / "test.conll", "\n\n".join(blocks[:1] + blocks[10:12]) + "\n\n")]
    ingest(home, "small", files, IngestOptions(format="conll2003"))
    detect_entities(home, "small", DetectorConfig(detectors=["gold"]))

    def exact(steps: int) -> float:
        return float(dp_accounting.pld.PLDAccountant().compose(dp_accounting.GaussianDpEvent(8.0), steps)
                     .get_epsilon(1e-5))

    stop = 76
    assert stop not in shown_rounds(90)
    config = TrainConfig(dataset="small", mechanism=TOY, steps=90, noise_multiplier=8.0, lr=1e-4,
                         max_epsilon=(exact(stop) + exact(stop + 1)) / 2, randomness="seeded", max_len=16,
                         checkpoint_every=0)
    result = train_configuration(home, config, progress=False)
    assert result.rounds == stop
    run = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(result.run_id)
    history = sorted((m.step, m.value) for m in MlflowClient(tracking_uri=home.mlflow_tracking_uri)
                     .get_metric_history(result.run_id, "epsilon"))
    assert [step for step, _ in history] == [r for r in shown_rounds(90) if r < stop] + [stop]
    for step, value in history:
        assert value == pytest.approx(exact(step), rel=1e-6), step
    final = float(run.data.metrics["final_epsilon"])
    assert max(value for _, value in history) == history[-1][1] == pytest.approx(final, rel=1e-12)
    assert final == pytest.approx(result.epsilon) and final <= config.params.max_epsilon  # type: ignore[attr-defined]
    assert f"stopped before step {stop + 1}: epsilon would exceed the budget" in result.notes


def test_the_fixture_mechanism_is_named_nowhere_in_the_project() -> None:
    """What the first test shows needs only this file: no module of the package names the toy."""
    folders = ("uedp", "flows", "tasks", "services", "privacy", "storage", "models", "detection", "deployments")
    assert not [path for folder in folders for path in (REPO / folder).rglob("*.py")
                if TOY in path.read_text(encoding="utf-8")]


def _registering_modules(folder: Path) -> set[str]:
    out = set()
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "register"
               for node in ast.walk(tree)):
            out.add(path.stem)
    return out


def test_every_module_that_registers_a_mechanism_is_listed() -> None:
    assert _registering_modules(REPO / "privacy" / "mechanisms" / "specs") == set(registry.MODULES)
    assert not _registering_modules(REPO / "privacy" / "mechanisms"), "mechanisms register from .specs"


def test_an_unlisted_registering_module_is_caught(tmp_path: Path) -> None:
    (tmp_path / "new_mechanism.py").write_text("register(MechanismSpec(name='x'))\n", encoding="utf-8")
    assert _registering_modules(tmp_path) - set(registry.MODULES) == {"new_mechanism"}
