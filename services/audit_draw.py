"""The one-run audit's canaries around a training run: drawn once per configuration (a resumed run plants
the same ones), kept with their secret coins in the data home (``audits/``, never logged), released
without the coins, and the record of how often each canary's host was sampled.

The coins are the audit's key: holding them, one can score the guesses. Without them, telling from the
run's releases which canaries were planted is exactly the attack the audit measures (its figures say
how well it went)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from uedp.detection.identity import entity_key
from uedp.errors import UedpError
from uedp.privacy.attacks.audit_canaries import AuditCanary, AuditDraw, draw_audit
from uedp.privacy.mechanisms.base import HostUnits, SamplesUnits
from uedp.privacy.mechanisms.registry import AuditDesign
from uedp.privacy.randomness import Randomness
from uedp.services.config import TrainConfig
from uedp.storage.home import DataHome

CANARY_CATEGORY = "PERSON"  # audit canaries are made-up names; the mechanisms see them as entities of the run


def canary_key(value: str) -> str:
    return entity_key(value)


def _pending(home: DataHome, config: TrainConfig) -> str:
    return f"pending-{config.dataset}-{config.fingerprint()}"


def _write(home: DataHome, name: str, draw: AuditDraw, record: Participation | None = None) -> None:
    home.audits_dir.mkdir(parents=True, exist_ok=True)
    target = home.audits_dir / f"{name}.json"
    partial = target.with_suffix(".json.tmp")
    raw = json.loads(draw.to_json()) | ({"participation": asdict(record)} if record is not None else {})
    partial.write_text(json.dumps(raw), encoding="utf-8")
    os.replace(partial, target)  # never a half-written draw


def draw_for(home: DataHome, config: TrainConfig, users: Sequence[str], resuming: bool = False) -> AuditDraw:
    """This configuration's canaries: the pending draw of an interrupted run of it, or a new draw (from
    the operating system's randomness, or from the seed with ``randomness=seeded``).

    ``resuming``: a checkpoint of this configuration exists, so its model has seen the pending draw's
    canaries; without that draw the run cannot go on (new coins would void the audit)."""
    design = config.spec.audit
    assert isinstance(design, AuditDesign), "TrainConfig refuses audit canaries for mechanisms without a design"
    pending = home.audits_dir / f"{_pending(home, config)}.json"
    if pending.is_file():
        draw = AuditDraw.from_json(pending.read_text(encoding="utf-8"))
        if len(draw.canaries) == config.audit_canaries and draw.unit == design.unit:
            return draw
    if resuming:
        raise UedpError(f"the checkpoint of this configuration trained on audit canaries whose draw {pending} is "
                        f"gone; remove {home.checkpoint_dir(config.dataset, config.fingerprint())} to start over")
    rng = Randomness.for_mode(config.randomness, config.seed).stream("audit-canaries")
    try:
        draw = draw_audit(config.audit_canaries, design.unit, design.adjacency, users, rng)
    except ValueError as exc:
        raise UedpError(f"dataset {config.dataset!r}: audit canaries: {exc}") from None
    _write(home, _pending(home, config), draw)
    return draw


def keep_for_run(home: DataHome, config: TrainConfig, run_id: str, draw: AuditDraw,
                 record: Participation | None) -> None:
    """File the draw and its participation record under the finished run's id (what ``uedp attack
    --kind audit`` reads)."""
    _write(home, run_id, draw, record)
    (home.audits_dir / f"{_pending(home, config)}.json").unlink(missing_ok=True)


def load_for_run(home: DataHome, run_id: str) -> tuple[AuditDraw, Participation | None] | None:
    """A run's audit draw and participation record, or None when it planted no audit canaries here."""
    path = home.audits_dir / f"{run_id}.json"
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    raw = json.loads(text).get("participation")
    return AuditDraw.from_json(text), Participation(**raw) if raw else None


def host_units(draw: AuditDraw, canary: AuditCanary) -> HostUnits:
    """The units a canary reaches training through. Tails under add/remove plant nothing: the units are
    then those the secret would have had, whose coins exist all the same."""
    value = draw.planted_value(canary) or canary.secret
    sequences = tuple(f"{host}#{j}" for j, host in enumerate(canary.hosts)) if canary.own_hosts() else ()
    return HostUnits(users=tuple(dict.fromkeys(canary.hosts)), sequences=sequences,
                     entities=(canary_key(value),) if draw.unit == "entity" else ())


@dataclass(frozen=True)
class Participation:
    """Per canary, in how many of the counted rounds the sampling took its host in (planted or not)."""

    first_round: int
    last_round: int
    per_canary: list[int]

    @property
    def rounds(self) -> int:
        return max(0, self.last_round - self.first_round + 1)

    def figures(self, included: Sequence[bool] | None = None) -> dict[str, float]:
        """Mean rounds and the share never sampled, over all canaries (or over the planted ones)."""
        values = np.asarray(self.per_canary, dtype=float)
        if included is not None:
            values = values[np.asarray(included, dtype=bool)]
        if not len(values):
            return {}
        return {"audit_host_rounds_mean": float(values.mean()),
                "audit_host_never_sampled": float(np.mean(values == 0)),
                "audit_host_rounds_counted": float(self.rounds)}


def participation(sampling: SamplesUnits | None, draw: AuditDraw, rounds: range) -> Participation | None:
    """Per canary, the rounds of ``rounds`` whose sampling took its host in (``sampling``: what the training
    returned, :attr:`Trained.sampling`; None: the mechanism does not Poisson-sample units, e.g. a noiseless
    run sees all the data every epoch)."""
    if sampling is None or not len(rounds):
        return None
    return Participation(rounds.start, rounds.stop - 1,
                         [sampling.rounds_with(host_units(draw, c), rounds) for c in draw.canaries])


def absent_units(draw: AuditDraw, counts: str | None) -> int:
    """Units of a mechanism's count (``spec.counts``) that the tails-up canaries would have added: the
    count with every canary planted is the exact count plus this."""
    absent = [c for c in draw.canaries if draw.planted_value(c) is None]
    if counts == "sequences":
        return sum(len(c.templates) for c in absent)
    if counts == "users":
        return sum(1 for c in absent if c.own_hosts())
    return 0  # anchored writers: canaries join real users' text in sentences naming an entity, anchoring nobody


def releasable(draw: AuditDraw) -> bool:
    """Whether the participation figures may be logged: only when every host is made up. A real user's
    sampling coins are private (amplification by sampling assumes nobody sees them), so for canaries in
    real users' text the record stays in the data home with the coins, for the auditor."""
    return all(c.own_hosts() for c in draw.canaries)

