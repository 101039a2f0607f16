"""A sweep's parent MLflow run (its configuration, base plus grid, is :class:`tasks.config.SweepConfig`): one base configuration (shared run settings and every mechanism parameter, each with its
one default) plus a grid (mechanisms x entity category sets x target epsilons x seeds), expanded into
training configurations; and the parent MLflow run that the sweep's runs nest under.

Mechanisms without a guarantee run once per seed and category set they depend on (``noiseless`` once,
since categories do not change it): the registry says which settings a mechanism uses.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from uedp.errors import UedpError
from uedp.storage.home import DataHome
from uedp.tasks.config import SweepConfig, SweepItem
from uedp.tasks.tracking import RunTracker
from uedp.tasks.training import TrainResult


@dataclass(frozen=True)
class SweepOutcome:
    parent_run_id: str
    runs: list[TrainResult]
    failed: list[str]  # run names of configurations that failed
    report: list[str]  # files of the privacy-utility report


@dataclass
class SweepRun:
    """The sweep's parent MLflow run: opened with the grid as params, finished with the tally."""

    config: SweepConfig
    items: list[SweepItem]
    tracker: RunTracker
    finished: list[tuple[TrainResult, float | None]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

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
                            else config.settings.noise_multiplier})  # type: ignore[attr-defined]
        return cls(config, items, tracker)

    @property
    def run_id(self) -> str:
        return self.tracker.run_id

    def record(self, item: SweepItem, result: TrainResult | None) -> None:
        if result is None:
            self.failed.append(item.config.run_name())
        else:
            self.finished.append((result, item.target))

    def finish(self, report: list[str]) -> SweepOutcome:
        """Close the parent run; a sweep with failed configurations ends failed, naming them."""
        self.tracker.log_metrics({"configurations_failed": len(self.failed),
                                  "configurations_finished": len(self.finished)})
        self.tracker.finish(failed=bool(self.failed))
        if self.failed:
            raise UedpError(f"{len(self.failed)} of {len(self.items)} configurations failed: {', '.join(self.failed)} "
                            f"(the others are in MLflow run {self.run_id}; rerun to resume from checkpoints)")
        return SweepOutcome(self.run_id, [r for r, _ in self.finished], [], report)

    def abort(self) -> None:
        self.tracker.finish(failed=True)
