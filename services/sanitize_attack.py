"""The mask-token inference attack on a local-DP release (the thesis' Table 3.7), measured once per
release and attacker and then looked up.

The attack needs the release's draws (which token went in, which came out, where), so it can be measured
only where they are: the data home that drew the release. Its figures are kept (in the release's manifest
when measured at the draw, otherwise in ``<home>/cache/attacks/``) under the attacker's identity: the
content of its folder (sizes for large weight files), the number of sentences and the sample's seed.
So every training that reuses a release reports the attack's figures without running it again (torchrun
ranks included), and a different attacker is never reported under another's figures.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from uedp.errors import UedpError
from uedp.privacy.sanitization.draws import Draws
from uedp.privacy.sanitization.mechanisms import KEEP
from uedp.services.releases import ATTACK_FIGURES
from uedp.services.sanitize_config import SanitizeConfig
from uedp.storage.home import DataHome

HASHED_UP_TO = 16 << 20  # files up to this size are hashed whole; larger (model weights) by their size


class AttackFigures(TypedDict):
    """Share of masked words the attacker recovers: over all words, the sanitized ones, the original text."""

    mask_inference_success: float | None
    mask_inference_success_sanitized: float | None
    mask_inference_success_original: float | None


def _figures(values: dict[str, Any]) -> AttackFigures:
    return AttackFigures(mask_inference_success=values.get(ATTACK_FIGURES[0]),
                         mask_inference_success_sanitized=values.get(ATTACK_FIGURES[1]),
                         mask_inference_success_original=values.get(ATTACK_FIGURES[2]))


def no_attack() -> AttackFigures:
    return _figures({})


def attack_spec(config: SanitizeConfig) -> str:
    """The attack's identity: the attacker folder's content, the sentences attacked and the sample's seed."""
    folder = Path(config.attack_model or "")
    if not folder.is_dir():
        raise UedpError(f"attack model {folder} is not a folder (a bigram cloze model or a masked language model)")
    digest = hashlib.sha256(f"sentences={config.attack_sentences};seed={config.seed}".encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        size = path.stat().st_size
        digest.update(f"\0{path.relative_to(folder).as_posix()}\0{size}\0".encode())
        if size <= HASHED_UP_TO:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def attack_figures(home: DataHome, config: SanitizeConfig, release_key: str, manifest: Mapping[str, Any] | None,
                   draws: Draws | None, texts: list[str], text_of: Callable[[int], str]) -> AttackFigures:
    """The attack's figures for this release and the attacker ``config`` names (all None without one):
    those stored with the release or cached for it, else measured on its draws (and cached)."""
    if not config.attack_model:
        return no_attack()
    spec = attack_spec(config)
    stored = (manifest or {}).get("sanitization") or {}
    if (manifest or {}).get("attack_spec") == spec and stored.get(ATTACK_FIGURES[0]) is not None:
        return _figures(stored)
    cache = home.cache_dir("attacks") / f"{release_key[:16]}-{spec[:16]}.json"
    if cache.is_file():
        return _figures(json.loads(cache.read_text(encoding="utf-8")))
    if draws is None:
        raise UedpError(f"sanitized dataset {config.output_name!r}: its draws are not in this data home (it was "
                        "pulled from a table store, or drawn by an older uedp), so this attacker cannot be run on "
                        "it here; run the attack where the release was drawn")
    figures = measure_attack(config, [texts[r] for r in draws.rows], draws, text_of)
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_name(f".{cache.name}.tmp-{os.getpid()}")
    partial.write_text(json.dumps(figures), encoding="utf-8")
    partial.replace(cache)
    return _figures(figures)


def measure_attack(config: SanitizeConfig, texts: list[str], draws: Draws,
                   text_of: Callable[[int], str]) -> dict[str, float]:
    """The attack on a seeded sample of the sanitized train sentences (the same sample for every release
    of a dataset, so releases compare): each word masked in turn, against the release and the original."""
    from uedp.models.device import resolve_device
    from uedp.privacy.attacks.mask_inference import inference_success, load_predictor

    try:
        predict = load_predictor(Path(config.attack_model or ""), resolve_device("auto"))
    except ValueError as exc:
        raise UedpError(str(exc)) from None
    rng = np.random.default_rng(config.seed)
    picks = sorted(rng.choice(len(texts), size=min(config.attack_sentences, len(texts)), replace=False).tolist())
    original = [[texts[i][s:e] for s, e in draws.spans[i]] for i in picks]
    private = [[texts[i][s:e] if chosen == KEEP else text_of(int(out))
                for (s, e), chosen, out in zip(draws.spans[i], draws.records[i], draws.released[i])] for i in picks]
    sanitized_positions = [[chosen != KEEP for chosen in draws.records[i]] for i in picks]
    return {"mask_inference_success": inference_success(original, private, predict),
            "mask_inference_success_sanitized": inference_success(original, private, predict, only=sanitized_positions),
            "mask_inference_success_original": inference_success(original, original, predict)}
