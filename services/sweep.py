"""A sweep's parent MLflow run (its configuration, base plus grid, is :class:`services.sweep_config.SweepConfig`): one base configuration (shared run settings and every mechanism parameter, each with its
one default) plus a grid (mechanisms x entity category sets x target epsilons x seeds), expanded into
training configurations; and the parent MLflow run that the sweep's runs nest under.

Mechanisms without a guarantee run once per seed and category set they depend on (``noiseless`` once,
since categories do not change it): the registry says which settings a mechanism uses.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from uedp.errors import UedpError
from uedp.privacy.mechanisms.params import DEFAULT_NOISE_MULTIPLIER
from uedp.services.sweep_config import SweepConfig, SweepItem
from uedp.services.tracking import RunTracker
from uedp.services.training import TrainResult
from uedp.storage.home import DataHome


@dataclass(frozen=True)
class Failure:
    """A configuration that did not finish, and why.

    The cause is for the curator (the console, and the flow run's log, where Prefect records a failed
    task's error anyway); MLflow gets only what does not read the data: which configuration, and whether
    it was a configuration error or a crash (:meth:`released`). A refusal can depend on the data (a
    declared count below the true one), so its words stay out of MLflow."""

    name: str
    cause: str
    # Bad input or a refusal (an unreachable target epsilon, a missing table): rerunning cannot help.
    configuration_error: bool

    @classmethod
    def of(cls, name: str, exc: BaseException | None) -> Failure:
        """uedp's own errors name the setting and never quote the data; any other exception is named by
        its type only (its message could quote a sentence), and the flow run's log has the rest."""
        if isinstance(exc, UedpError):
            return cls(name, str(exc).splitlines()[0] if str(exc) else type(exc).__name__, True)
        kind = type(exc).__name__ if exc is not None else "crashed"
        return cls(name, f"{kind} (see the flow run's log)", False)

    def released(self) -> dict[str, str]:
        return {"configuration": self.name, "kind": "configuration error" if self.configuration_error else "crash"}

    def describe(self) -> str:
        advice = "fix the setting" if self.configuration_error else "rerun to resume from its checkpoint"
        return f"{self.name}: {self.cause} ({advice})"


@dataclass(frozen=True)
class SweepOutcome:
    parent_run_id: str
    runs: list[TrainResult]
    failures: list[Failure]  # configurations that did not finish, with their causes
    report: list[str]  # files of the privacy-utility report


class SweepFailed(UedpError):
    """Some configurations failed; carries what finished (the CLI prints it before the causes)."""

    def __init__(self, outcome: SweepOutcome, total: int):
        causes = "; ".join(f.describe() for f in outcome.failures)
        super().__init__(f"{len(outcome.failures)} of {total} configurations failed: {causes} "
                         f"(the others are in MLflow run {outcome.parent_run_id})")
        self.outcome, self.total = outcome, total

    def __reduce__(self) -> tuple[type[SweepFailed], tuple[SweepOutcome, int]]:
        return SweepFailed, (self.outcome, self.total)  # Prefect may persist a failed flow's exception


class SweepProgress:
    """``[k/N]`` lines as configurations start and end, with the result or the cause, the elapsed time and
    an estimate of the time left (mean time per finished configuration): one line each, readable in a
    terminal, a log file and the Prefect UI's flow run log alike."""

    def __init__(self, total: int, say: Callable[[str], None]):
        self.total, self.say, self.ended, self.skipped = total, say, 0, 0
        self.started_at = self._began = time.monotonic()

    def starting(self, index: int, item: SweepItem) -> None:
        self._began = time.monotonic()
        target = f" (target epsilon {item.target:g})" if item.target is not None else ""
        self.say(f"[{index}/{self.total}] {item.config.run_name()}{target}: training")

    def reused(self, index: int, item: SweepItem, result: TrainResult) -> None:
        """A configuration trained to the end before (``reuse_finished``): said with its run, and left out
        of the estimate of the time left."""
        self.skipped += 1
        self.say(f"[{index}/{self.total}] {item.config.run_name()}: finished before (MLflow run {result.run_id}), "
                 f"not trained again: {_figures(result)}")

    def ended_with(self, index: int, item: SweepItem, result: TrainResult | None, failure: Failure | None) -> None:
        self.ended += 1
        now = time.monotonic()
        left = self.total - self.ended - self.skipped
        eta = f", about {_duration((now - self.started_at) / self.ended * left)} left" if left else ""
        took = f"{_duration(now - self._began)}{eta}"
        if result is not None:
            self.say(f"[{index}/{self.total}] {item.config.run_name()}: {_figures(result)} ({took})")
        elif failure is not None:
            self.say(f"[{index}/{self.total}] FAILED {failure.describe()} ({took})")


def _figures(result: TrainResult) -> str:
    epsilon = "no guarantee" if math.isinf(result.epsilon) else f"epsilon {result.epsilon:.3g}"
    return f"{epsilon}, test {result.utility_metric} {result.utility_test:.4g}"


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


@dataclass
class SweepRun:
    """The sweep's parent MLflow run: opened with the grid as params, finished with the tally."""

    config: SweepConfig
    items: list[SweepItem]
    tracker: RunTracker
    finished: list[tuple[TrainResult, float | None]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    @classmethod
    def open(cls, home: DataHome, config: SweepConfig, items: list[SweepItem], flow_run_id: str) -> SweepRun:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        tracker = RunTracker(home, config.dataset, f"sweep-{stamp}",
                             {"uedp.dataset": config.dataset, "uedp.kind": "sweep", "uedp.flow_run_id": flow_run_id})
        tracker.log_params({"mechanisms": config.mechanisms, "category_sets": [" ".join(c) for c in config.category_sets],
                            "target_epsilons": config.target_epsilons or "none", "seeds": config.seeds,
                            "model": config.run.model, "model_size": config.run.model_size,
                            "configurations": len(items), "randomness": config.run.randomness,
                            "grid": " ".join(f"{k}={','.join(map(str, v))}" for k, v in config.grid.items()) or "none",
                            "noise_multiplier": "calibrated" if any(i.target is not None for i in items)
                            else config.settings.noise_multiplier or DEFAULT_NOISE_MULTIPLIER})  # type: ignore[attr-defined]
        return cls(config, items, tracker)

    @property
    def run_id(self) -> str:
        return self.tracker.run_id

    def record(self, item: SweepItem, result: TrainResult | None, failure: Failure | None = None) -> None:
        if result is not None:
            self.finished.append((result, item.target))
        else:
            self.failures.append(failure or Failure.of(item.config.run_name(), None))

    def finish(self, report: list[str]) -> SweepOutcome:
        """Close the parent run (the causes of failures in ``failures.json`` and a tag); a sweep with failed
        configurations ends failed, raising :class:`SweepFailed` with what did finish."""
        self.tracker.log_metrics({"configurations_failed": len(self.failures),
                                  "configurations_finished": len(self.finished)})
        if self.failures:
            released = [f.released() for f in self.failures]
            self.tracker.log_json(released, "failures.json")
            self.tracker.set_tags({"uedp.failures": "; ".join(f"{r['configuration']}: {r['kind']}"
                                                                for r in released)[:4900]})
        self.tracker.finish(failed=bool(self.failures))
        outcome = SweepOutcome(self.run_id, [r for r, _ in self.finished], list(self.failures), report)
        if self.failures:
            raise SweepFailed(outcome, len(self.items))
        return outcome

    def abort(self) -> None:
        self.tracker.finish(failed=True)
