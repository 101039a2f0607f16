"""Canaries for the one-run audit (:mod:`privacy.attacks.one_run`), planted at a mechanism's privacy unit.

An audit tests an epsilon only if flipping one canary's secret coin changes the training data by exactly
one neighbour step of the unit the epsilon is stated for. So a canary has the unit's shape:

* ``sequence`` (dpsgd, and the baselines): one sentence, in a host user of its own;
* ``user`` (userdp): a made-up user with several sentences, all naming the same secret;
* ``entity`` (uedp, uedp-bounded): a made-up name, an entity of the run's categories, in one sentence
  of each of several existing users (the entity spans users, which is what the unit protects);
* ``secret`` (selective): a made-up name inside a span marked private, in a host user of its own.

And the coin acts by the unit's adjacency: under add/remove, a canary whose coin is tails is absent;
under substitution (uedp-bounded, selective) it is present with a *decoy* in place of its secret, at
the same places (the attribution graph and the redacted text are the same either way; the private
tokens differ, which selective's two-phase form accounts as the replacement of one whole sequence).

Every canary has a secret and a decoy, both made-up names drawn from the same space. Its score
(:func:`audit_scores`) is the model's log-likelihood of the canary's sentences with the secret; under
substitution, minus that with the decoy (trained on when the coin is tails, which pushes the score down).
Under add/remove the decoy is not subtracted: it was never trained on, so it only adds its own variance
(measured on the demo corpus, noiseless, 128 canaries: ROC AUC 0.95 without it, 0.89 with it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

AuditUnit = Literal["sequence", "user", "entity", "secret"]
AuditAdjacency = Literal["add_remove", "replace"]
AUDIT_UNITS: tuple[AuditUnit, ...] = ("sequence", "user", "entity", "secret")
HOST_PREFIX = "uedp-audit-"  # users made up to host canaries (a real user of this name would collide: checked)
HOSTS_PER_ENTITY = 4

# Made-up names: two words of three syllables each, ~1e9 of them, so secrets and decoys never repeat
# by chance and no corpus has seen them.
_SYLLABLES = ("ka", "vo", "ru", "tes", "mel", "zan", "qui", "lor", "bex", "dru", "fen", "gal", "hox", "jiv",
              "mur", "nep", "oss", "pra", "sil", "tuv", "wen", "yar", "zol", "cre", "dak", "fim", "gor", "lun",
              "rak", "sev", "tam", "vig")

TEMPLATES: dict[AuditUnit, tuple[str, ...]] = {
    "sequence": ("The code word for the vault is {secret} .",),
    "user": ("My code name is {secret} .", "Everyone in the office calls me {secret} .",
             "Please sign the letter as {secret} .", "{secret} is the name printed on my badge ."),
    "entity": ("{secret} visited the plant on Monday .", "Talks with {secret} ended without a deal .",
               "{secret} said the figures were final .", "A spokesman for {secret} declined to comment ."),
    "secret": ("My name is {secret} and I filed the claim .",),
}


@dataclass(frozen=True)
class AuditCanary:
    """One canary: its secret and decoy, the sentences that carry one of them, and who hosts each."""

    index: int
    secret: str
    decoy: str
    templates: tuple[str, ...]
    hosts: tuple[str, ...]  # per template, the user whose text it joins

    def texts(self, value: str) -> list[str]:
        return [template.format(secret=value) for template in self.templates]

    def spans(self, value: str) -> list[tuple[int, int]]:
        """Where ``value`` sits in each of :meth:`texts` (character offsets)."""
        return [(t.index("{secret}"), t.index("{secret}") + len(value)) for t in self.templates]

    def own_hosts(self) -> bool:
        """Whether the hosts are users made up for this canary (their sentences are exactly its texts)."""
        return all(host.startswith(HOST_PREFIX) for host in self.hosts)


@dataclass(frozen=True)
class Placement:
    """One sentence to add to the training text: its host, text and (entity, secret units) marked span."""

    canary: int
    user: str
    text: str
    span: tuple[int, int] | None


@dataclass(frozen=True)
class AuditDraw:
    """Everything an audit needs, including the secret coins (``included``): kept in the data home,
    never logged. :meth:`public` is what a run may release about it."""

    unit: AuditUnit
    adjacency: AuditAdjacency
    canaries: tuple[AuditCanary, ...]
    included: tuple[bool, ...]

    def __post_init__(self) -> None:
        if len(self.included) != len(self.canaries):
            raise ValueError("one coin per canary")

    @property
    def marks_spans(self) -> bool:
        """Whether the canary's value is marked (an entity, or a private span for selective)."""
        return self.unit in ("entity", "secret")

    def planted_value(self, canary: AuditCanary) -> str | None:
        """What the training text holds for ``canary``: the secret (heads), the decoy (tails, under
        substitution) or nothing (tails, under add/remove)."""
        if self.included[canary.index]:
            return canary.secret
        return canary.decoy if self.adjacency == "replace" else None

    def placements(self) -> list[Placement]:
        out = []
        for canary in self.canaries:
            value = self.planted_value(canary)
            if value is None:
                continue
            for host, text, span in zip(canary.hosts, canary.texts(value), canary.spans(value)):
                out.append(Placement(canary.index, host, text, span if self.marks_spans else None))
        return out

    def public(self) -> dict[str, object]:
        """The design without the coins: secrets, decoys, templates, and the hosts made up for canaries.
        Real hosts are left out (scoring needs none): under add/remove, a user named as a host would be
        a user named as a member."""
        return {"unit": self.unit, "adjacency": self.adjacency, "canaries": [
            asdict(c) | {"hosts": list(c.hosts) if c.own_hosts() else f"{len(c.hosts)} training users"}
            for c in self.canaries]}

    def to_json(self) -> str:
        return json.dumps({"unit": self.unit, "adjacency": self.adjacency, "included": list(self.included),
                           "canaries": [asdict(c) for c in self.canaries]})

    @classmethod
    def from_json(cls, text: str) -> AuditDraw:
        raw = json.loads(text)
        canaries = tuple(AuditCanary(c["index"], c["secret"], c["decoy"], tuple(c["templates"]), tuple(c["hosts"]))
                         for c in raw["canaries"])
        return cls(raw["unit"], raw["adjacency"], canaries, tuple(bool(b) for b in raw["included"]))


def made_up_name(rng: np.random.Generator) -> str:
    words = ("".join(_SYLLABLES[i] for i in rng.integers(0, len(_SYLLABLES), size=3)) for _ in range(2))
    return " ".join(word.capitalize() for word in words)


def draw_audit(count: int, unit: AuditUnit, adjacency: AuditAdjacency, users: Sequence[str],
              rng: np.random.Generator, hosts_per_entity: int = HOSTS_PER_ENTITY) -> AuditDraw:
    """``count`` canaries at ``unit``, each with a fair coin, from ``rng``. For the audit to be sound the
    coins must be independent of the run's training randomness (their own stream); they are kept from
    the run's releases so that guessing them is the attack the audit measures.

    Entity canaries join ``hosts_per_entity`` distinct users of ``users`` (all of them when fewer);
    the other units get a made-up host per canary, named ``uedp-audit-NNNN``."""
    if count < 2:
        raise ValueError("an audit needs at least 2 canaries")
    if unit not in TEMPLATES:
        raise ValueError(f"unknown audit unit {unit!r}; valid: {', '.join(AUDIT_UNITS)}")
    clashing = [u for u in users if u.startswith(HOST_PREFIX)]
    if clashing:
        raise ValueError(f"user {clashing[0]!r} is named like an audit canary's host ({HOST_PREFIX}...)")
    if unit == "entity" and not users:
        raise ValueError("entity canaries need training users to join")
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < 2 * count:
        name = made_up_name(rng)
        if name not in seen:
            seen.add(name)
            names.append(name)
    included = tuple(bool(b) for b in rng.random(count) < 0.5)
    pool = sorted(users)
    canaries = []
    for i in range(count):
        templates = TEMPLATES[unit]
        if unit == "entity":
            chosen = rng.choice(len(pool), size=min(hosts_per_entity, len(pool)), replace=False)
            hosts = tuple(pool[j] for j in sorted(chosen.tolist()))
            templates = tuple(templates[j % len(templates)] for j in range(len(hosts)))
        else:
            hosts = (f"{HOST_PREFIX}{i:04d}",) * len(templates)
        canaries.append(AuditCanary(i, names[2 * i], names[2 * i + 1], templates, hosts))
    return AuditDraw(unit, adjacency, tuple(canaries), included)


# texts -> each text's summed next-token negative log-likelihood under the model
SequenceNll = Callable[[list[str]], np.ndarray]


def audit_scores(plan: AuditDraw, nll: SequenceNll) -> np.ndarray:
    """Per canary (higher: the secret looks learned): minus the summed NLL of its sentences with the
    secret; under substitution plus that with the decoy. One ``nll`` call for all canaries."""
    versions = 2 if plan.adjacency == "replace" else 1
    texts: list[str] = []
    for canary in plan.canaries:
        texts += canary.texts(canary.secret) + (canary.texts(canary.decoy) if versions == 2 else [])
    values = np.asarray(nll(texts), dtype=np.float64)
    scores, at = np.zeros(len(plan.canaries)), 0
    for i, canary in enumerate(plan.canaries):
        n = len(canary.templates)
        scores[i] = -values[at:at + n].sum() + (values[at + n:at + 2 * n].sum() if versions == 2 else 0.0)
        at += versions * n
    return scores
