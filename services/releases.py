"""A local-DP release as training opens it: by name, never drawn here.

Drawing a release (:mod:`services.sanitize`) reads the private text, files the draw in the dataset's
privacy ledger and may run the mask-inference attack; a training must not do any of that as a side
effect of setting itself up, or the same release could be drawn (and charged) in two places. So the
draw step records what it produced, keyed by the release's settings and the attacker, and a training
opens that record: :func:`open_release` reads it, checks that the release it describes is still the one
in the data home, and refuses with the command that draws it when there is none.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uedp.errors import UedpError
from uedp.privacy.sanitization.release import ReleaseFigures
from uedp.services.config import TrainConfig
from uedp.services.sanitize_config import SanitizeConfig
from uedp.storage.home import DataHome
from uedp.storage.manifests import sentences_manifest
from uedp.storage.tables import hash_config

# The mask-inference attack's figures (thesis Table 3.7), when an attack model was given.
ATTACK_FIGURES = ("mask_inference_success", "mask_inference_success_sanitized", "mask_inference_success_original")


@dataclass(frozen=True)
class SanitizeResult(ReleaseFigures):
    """A release's figures (:class:`privacy.sanitization.release.ReleaseFigures`), its dataset and statement."""

    dataset: str
    reused: bool
    unprotected_share: float  # custext: vocabulary tokens of type 1-N (no adjacent token)
    statement: str
    randomness: str = "secure"
    caveats: tuple[str, ...] = ()
    # The mask-token inference attack (thesis Table 3.7), when an attack model was given: share of all
    # positions / of sanitized positions recovered from the sanitized text, and from the original text.
    mask_inference_success: float | None = None
    mask_inference_success_sanitized: float | None = None
    mask_inference_success_original: float | None = None

    def attack_figures(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in ATTACK_FIGURES}


def sanitize_config(config: TrainConfig) -> SanitizeConfig:
    """The local-DP release a configuration trains on (its train split, sanitized with its parameters)."""
    settings = config.params.model_dump(include=set(SanitizeConfig.model_fields))
    return SanitizeConfig(**settings, dataset=config.dataset, categories=list(config.categories), seed=config.seed,
                          randomness=config.randomness)


def _record_path(home: DataHome, config: SanitizeConfig) -> Path:
    """Where the draw step records a release for these settings and this attacker (one file each)."""
    return home.cache_dir("releases") / f"{config.output_name}-{hash_config(config.model_dump())[:16]}.json"


def record_release(home: DataHome, config: SanitizeConfig, release_key: str, result: SanitizeResult) -> None:
    """Called by the draw step once a release is drawn or reused: what a training opens (atomically)."""
    path = _record_path(home, config)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    partial.write_text(json.dumps({"key": release_key, "result": asdict(result)}, sort_keys=True), encoding="utf-8")
    partial.replace(path)


def open_release(home: DataHome, config: SanitizeConfig) -> SanitizeResult:
    """The release ``config`` names, as its draw step recorded it (``reused``: a training draws nothing).
    Refused when it was never drawn here, or when the dataset's folder now holds another release."""
    path = _record_path(home, config)
    manifest = sentences_manifest(home, config.output_name)
    record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if manifest is None or record.get("key") != manifest.key:
        raise UedpError(f"the local-DP release {config.output_name!r} this training reads is not drawn in this data "
                        f"home{' (its folder now holds another draw)' if manifest is not None and record else ''}: "
                        f"draw it first (`uedp train` and the train flow do, before training; or `uedp sanitize "
                        f"{config.dataset} --mechanism {config.mechanism} --epsilon {config.epsilon:g} ...`)")
    fields = dict(record["result"])
    fields["caveats"] = tuple(fields.get("caveats") or ())
    return SanitizeResult(**{**fields, "reused": True})
