"""A finished training run as MLflow holds it: its configuration, privacy statement, model, tokenizer and
planted canaries, downloaded from its artifacts. What ``uedp attack`` aims at and what ``uedp generate``
samples from; both only read what the run already released."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from uedp.errors import UedpError
from uedp.models.checkpoints import RESOLVED_CONFIG
from uedp.models.saving import load_saved
from uedp.models.tokenization import load_tokenizer
from uedp.privacy.attacks.canaries import Canary
from uedp.privacy.statement import PrivacyStatement
from uedp.services.config import TrainConfig
from uedp.services.tracking import RunTracker


@dataclass
class LoggedRun:
    """What a training run logged, loaded onto ``device``."""

    run_id: str
    config: TrainConfig
    statement: PrivacyStatement | None  # None: a run of an older uedp that logged none
    model: torch.nn.Module
    tokenizer: Any
    canaries: list[Canary] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)


def statement_of(logged: dict[str, Any]) -> PrivacyStatement | None:
    """The privacy statement a run logged in its resolved configuration (tuples come back as lists), or None
    when it logged none."""
    data = dict(logged.get("privacy") or {})
    if not data.get("mechanism") or not data.get("unit"):
        return None
    known = {k: v for k, v in data.items() if k in PrivacyStatement.__dataclass_fields__}
    for name in ("public", "caveats"):
        known[name] = tuple(known.get(name) or ())
    known["epsilon"] = float(known.get("epsilon", float("inf")))
    return PrivacyStatement(**known)


def _logged_json(tracker: RunTracker, tmp: Path) -> dict[str, Any]:
    config_file = tracker.download(RESOLVED_CONFIG, tmp)
    if config_file is None:
        raise UedpError(f"run {tracker.run_id} has no {RESOLVED_CONFIG}: not a finished uedp training run")
    logged: dict[str, Any] = json.loads(config_file.read_text(encoding="utf-8"))
    return logged


def _canaries_in(tracker: RunTracker, tmp: Path) -> list[Canary]:
    canaries_file = tracker.download("canaries.json", tmp)
    return [Canary(**c) for c in json.loads(canaries_file.read_text())] if canaries_file else []


def logged_config(tracker: RunTracker) -> TrainConfig:
    """The configuration a run logged, without its model."""
    with tempfile.TemporaryDirectory() as tmp:
        return TrainConfig.from_logged(_logged_json(tracker, Path(tmp))["config"])


def logged_canaries(tracker: RunTracker) -> list[Canary]:
    """The canaries a run planted (made-up secrets, released with it), without its model."""
    with tempfile.TemporaryDirectory() as tmp:
        return _canaries_in(tracker, Path(tmp))


def load_logged_run(tracker: RunTracker, device: torch.device, purpose: str, task: str = "lm") -> LoggedRun:
    """A run's model of ``task`` (a language model, or a classifier), from its MLflow artifacts (``purpose``: what
    it is loaded for, in errors)."""
    tracker.require_run()
    with tempfile.TemporaryDirectory() as tmp:
        logged = _logged_json(tracker, Path(tmp))
        config = TrainConfig.from_logged(logged["config"])
        if config.task != task:
            wanted, trained = (("a language model", "a classifier") if task == "lm" else
                               ("a classifier", "a language model"))
            raise UedpError(f"{purpose} needs {wanted}; run {tracker.run_id} trained {trained}")
        model_dir = tracker.download("model", Path(tmp))
        if model_dir is None:
            raise UedpError(f"run {tracker.run_id} has no stored model; train with --log-model (or --canaries)")
        tokenizer = load_tokenizer(model_dir)
        model: torch.nn.Module = load_saved(model_dir, config.model).to(device)
        canaries = _canaries_in(tracker, Path(tmp))
    tags = dict(tracker.client.get_run(tracker.run_id).data.tags)
    return LoggedRun(tracker.run_id, config, statement_of(logged), model, tokenizer, canaries, tags)
