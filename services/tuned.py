"""Hyperparameters chosen on public text (``uedp tune``), and a private run that takes them (``--tuned KEY``).

Choosing a learning rate or a clip by trying several on the private data and keeping the best is itself a
release about that data (Papernot and Steinke 2022: the choice leaks, and the reported epsilon does not
count it). uedp chooses on a **public proxy** instead: a dataset the user treats as public, e.g. the corpus
of the public base split into pseudo-writers, and a private run names the search's record. The record holds
the trials' whole lineage (keyed ids, :mod:`services.lineage`): the proxy's text, and everything their start
and tokenizer had seen. A run whose own text is among them (under any name, or as a copy of part of its
train split) is refused rather than accounted: its hyperparameters would have been chosen by trials whose
results depend on the very text its epsilon protects. The chosen values are then public settings, named in
the run's statement with the trials' start, like the run's own public start.

This module reads and applies records; :mod:`services.tune` runs the search that writes them.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uedp.errors import UedpError
from uedp.services.config import TrainConfig
from uedp.services.lineage import meets_text
from uedp.storage.home import DataHome

# What a search may choose: learning rates and the clip (the settings whose best value moves with the data;
# the privacy settings, epsilon, sampling and rounds, stay the user's).
TUNABLE = ("server_lr", "clip", "local_lr", "lr")


@dataclass(frozen=True)
class Trial:
    """One point of the grid, trained on the proxy."""

    values: dict[str, float]
    perplexity_valid: float  # the proxy's validation split (inf: the run diverged)
    run_id: str


@dataclass(frozen=True)
class TuneRecord:
    """A finished search: where it ran, what it tried and what it chose."""

    key: str
    dataset: str  # the public proxy
    lineage: tuple[str, ...]  # the trials' text ids: the proxy's, their start's and their tokenizer's (keyed)
    mechanism: str
    grid: dict[str, list[float]]
    trials: tuple[Trial, ...]
    chosen: dict[str, float]
    start: tuple[str, ...] = ()  # the trials' start and tokenizer, in the statement's words
    version: int = 1  # 1: an older uedp's record, whose lineage holds the proxy's text only

    def describe(self) -> str:
        """The search in a privacy statement's words."""
        values = ", ".join(f"{name} {value:g}" for name, value in self.chosen.items())
        started = "; the trials started from " + "; ".join(self.start) if self.start else ""
        return (f"hyperparameters: {values}, chosen by uedp tune {self.key} ({len(self.trials)} trials of "
                f"{self.mechanism} on dataset {self.dataset!r}, by validation perplexity{started}), whose text is "
                "treated as public")

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "lineage": list(self.lineage), "trials": [asdict(t) for t in self.trials],
                "start": list(self.start)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuneRecord:
        return cls(str(data["key"]), str(data["dataset"]), tuple(data.get("lineage", ())), str(data["mechanism"]),
                   {k: [float(v) for v in vs] for k, vs in data["grid"].items()},
                   tuple(Trial(**t) for t in data["trials"]), {k: float(v) for k, v in data["chosen"].items()},
                   tuple(str(s) for s in data.get("start", ())), int(data.get("version", 1)))


def record_path(home: DataHome, key: str) -> Path:
    return home.tuned_dir / f"{key[:16]}.json"


def write_record(home: DataHome, record: TuneRecord) -> None:
    """Atomically: a search stopped halfway leaves no record, and its finished trials are reused (their runs
    are resumable configurations)."""
    path = record_path(home, record.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record.as_json(), indent=1), encoding="utf-8")
    os.replace(tmp, path)


def read_record(home: DataHome, key: str) -> TuneRecord | None:
    path = record_path(home, key)
    if not path.is_file():
        return None
    try:
        return TuneRecord.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UedpError(f"{path}: not a uedp tune record ({exc}); remove it and run the search again") from None


def records(home: DataHome) -> list[TuneRecord]:
    """Every search recorded in the data home, newest first."""
    folder = home.tuned_dir
    paths = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True) if folder.is_dir() else []
    return [record for p in paths if (record := read_record(home, p.stem)) is not None]


def tuned_record(home: DataHome, config: TrainConfig) -> TuneRecord | None:
    """The record a configuration names with ``tuned``, after the checks that make its values public: it
    exists, its mechanism's parameters include every chosen one, and it did not search on this run's text."""
    if not config.tuned:
        return None
    record = read_record(home, config.tuned)
    if record is None:
        known = ", ".join(r.key for r in records(home)) or "none yet"
        raise UedpError(f"--tuned {config.tuned}: no such search in this data home (recorded: {known}); run "
                        "uedp tune PUBLIC_DATASET first")
    missing = [name for name in record.chosen if name not in type(config.params).model_fields]
    if missing:
        raise UedpError(f"--tuned {config.tuned}: it chose {', '.join(missing)}, which {config.mechanism} does not "
                        f"take (the search tuned {record.mechanism})")
    if meets_text(home, config.dataset, record.lineage, record.dataset):
        raise UedpError(f"--tuned {config.tuned}: that search ran on dataset {record.dataset!r}, whose text is the "
                        f"text this run protects ({config.dataset!r}), or its trials started from a model or a "
                        "vocabulary that saw it (a copy of it, or of part of its train split, under any name counts): "
                        "choosing hyperparameters on it is a release its epsilon does not count. Search on public "
                        "text (e.g. the base's corpus in pseudo-writers) from a public start and name that search")
    if record.version < 2:
        raise UedpError(f"--tuned {config.tuned}: that search was recorded by an older uedp, which kept the proxy's "
                        "text but not what its trials started from, so it cannot be checked against this run's text. "
                        f"Run it again (uedp tune {record.dataset} with the same settings) and name the new key")
    return record


def apply_tuned(home: DataHome, config: TrainConfig) -> TrainConfig:
    """The configuration with the searched values in place of its own (the same configuration when it names
    no search, or already holds them)."""
    record = tuned_record(home, config)
    if record is None or config.params.holds(record.chosen):
        return config
    return with_values(config, record.chosen)


def with_values(config: TrainConfig, values: dict[str, float]) -> TrainConfig:
    """``config`` with some mechanism parameters replaced, validated as the mechanism's parameters."""
    params = type(config.params).model_validate({**config.params.model_dump(), **values})
    return config.model_copy(update={"params": params})


def tuned_public(home: DataHome, config: TrainConfig) -> tuple[str, ...]:
    """What the run's statement lists as public about its hyperparameters."""
    record = tuned_record(home, config)
    return (record.describe(),) if record is not None else ()
