"""``uedp tune``: a short grid search of learning rates and clip on a public proxy dataset.

Each point of the grid is an ordinary training run of the configuration the private run will use (same
mechanism, target epsilon, sampling, rounds and start), on the proxy instead of the private dataset; the
point with the least validation perplexity is chosen and recorded (:mod:`services.tuned`) under a key of
the proxy's text, the configuration and the grid. The same search again reuses the record, and an
interrupted search resumes its unfinished trial from its checkpoint like any run.

Why at the private run's own epsilon: the best learning rate of a noised update depends on how noisy it
is, so the trials carry noise of the same multiplier. The proxy should have about as many (pseudo-)writers
as the private dataset, since the noise-to-signal of a user-level run scales with the users per round.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from uedp.errors import UedpError
from uedp.services.config import TrainConfig
from uedp.services.initial_model import resolve_start
from uedp.services.launch import run_training
from uedp.services.lineage import run_lineage, text_lineage
from uedp.services.text_overlap import remember
from uedp.services.tuned import TUNABLE, Trial, TuneRecord, read_record, with_values, write_record
from uedp.storage.home import DataHome
from uedp.storage.tables import hash_config

TUNE_VERSION = 2  # 2: the record holds the trials' whole lineage (proxy, start, tokenizer)


def grid_points(grid: dict[str, list[float]]) -> list[dict[str, float]]:
    """Every combination of the grid's values, in the order given."""
    names = list(grid)
    return [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]


def check_grid(config: TrainConfig, grid: dict[str, list[Any]]) -> None:
    """A grid over settings a search may choose and this mechanism takes, with positive values and at least
    two points (one point chooses nothing)."""
    if not grid:
        raise UedpError(f"uedp tune: give the grid to search, e.g. --grid server_lr=3e-4,1e-3,3e-3 (any of "
                        f"{', '.join(TUNABLE)})")
    for name, values in grid.items():
        if name not in TUNABLE:
            raise UedpError(f"--grid {name}: a search chooses only {', '.join(TUNABLE)}; privacy settings (epsilon, "
                            "sampling, rounds) are the user's")
        if name not in type(config.params).model_fields:
            raise UedpError(f"--grid {name}: {config.mechanism} has no such parameter")
        if not values or any(not isinstance(v, (int, float)) or not v > 0 for v in values):
            raise UedpError(f"--grid {name}: give positive numbers, e.g. {name}=1e-3,3e-3")
    if len(grid_points(grid)) < 2:
        raise UedpError("uedp tune: the grid has one point; give at least two values to choose between")


def tune_key(home: DataHome, config: TrainConfig, grid: dict[str, list[float]]) -> str:
    """The search: the proxy's text, the configuration (seed included) and the grid."""
    return hash_config({"version": TUNE_VERSION, "text": list(text_lineage(home, config.dataset)),
                        "config": config.fingerprint(), "grid": grid})[:16]


def tune(home: DataHome, config: TrainConfig, grid: dict[str, list[Any]], say: Callable[[str], None] = print,
         progress: bool = True) -> TuneRecord:
    """Run (or reuse) the search of ``grid`` around ``config`` on its dataset, the public proxy."""
    check_grid(config, grid)
    grid = {name: [float(v) for v in values] for name, values in grid.items()}
    if config.tuned:
        raise UedpError("uedp tune: drop --tuned (a search starts from the configuration's own values)")
    key = tune_key(home, config, grid)
    if (done := read_record(home, key)) is not None:
        say(f"search {key} already done on {config.dataset}: chose {_values(done.chosen)}")
        return done
    # What the trials' results depend on beyond the proxy: the weights and the vocabulary they start from
    # (a start trained on the private text makes the choice a release of it; services.tuned refuses it).
    start = resolve_start(home, config)
    remember(home, config.dataset)
    trials: list[Trial] = []
    points = grid_points(grid)
    for number, point in enumerate(points, 1):
        trial = with_values(config, point).model_copy(update={"variant": f"tune-{key[:8]}-{_values(point, '-')}"})
        say(f"trial {number}/{len(points)} on {config.dataset}: {_values(point)}")
        # custext/santext: the launch draws the proxy's release (once) before the trial opens it
        result = run_training(home, trial, progress=progress)
        value = result.utility_valid if math.isfinite(result.utility_valid) else math.inf
        trials.append(Trial(point, value, result.run_id))
        say(f"trial {number}/{len(points)}: validation perplexity {value:.4g} (run {result.run_id})")
    best = min(trials, key=lambda t: t.perplexity_valid)
    if not math.isfinite(best.perplexity_valid):
        raise UedpError("uedp tune: every trial diverged; try smaller learning rates")
    record = TuneRecord(key, config.dataset, run_lineage(home, config.dataset, start.lineage), config.mechanism, grid,
                        tuple(trials), dict(best.values), start.public, TUNE_VERSION)
    write_record(home, record)
    say(f"search {key}: chose {_values(best.values)} (validation perplexity {best.perplexity_valid:.4g}); "
        f"a private run takes it with --tuned {key}")
    return record


def _values(values: dict[str, float], sep: str = ", ") -> str:
    return sep.join(f"{name}={value:g}" for name, value in values.items())
