"""Membership inference (Carlini et al. 2021 style) at the sentence, user and entity level.

A candidate's score is minus its loss (mean next-token NLL): members tend to have lower loss. Two
calibrations remove how "easy" a text is regardless of training: ``zlib`` divides the summed NLL by
the text's zlib-compressed size in bits, ``reference`` subtracts a reference model's loss (a model
not trained on the candidates). User and entity scores are the mean score of the sentences of that
user, or containing that entity. Members and non-members are a seeded sample of a configured size,
the same number of each (:func:`fixed_sample`): with every training unit as a member, the number of
members would be the exact count of private units, which may not be released (docs/PRIVACY.md); a
configured size is public, so the counts can be shown and logged beside the AUC and its interval.

Its figures are attack scores, not evidence about epsilon: members come from the training split and
non-members from the test split, which is not a random assignment of candidates to "in" or "out" (a
corpus split by file, as CoNLL-2003's, differs in distribution between files; an untrained model scored
an "epsilon bound" of 0.178 on train vs testb). A lower bound on epsilon needs membership decided by a
secret coin per candidate, which only the one-run audit's canaries have (:mod:`privacy.attacks.one_run`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from uedp.errors import UedpError
from uedp.privacy.attacks.metrics import AttackFigures, attack_figures

Calibration = Literal["none", "zlib", "reference"]
SentenceScorer = Callable[[list[str]], np.ndarray]  # texts -> (n, 2): summed NLL, predicted tokens


def zlib_bits(text: str) -> float:
    return 8.0 * len(zlib.compress(text.encode("utf-8")))


def sentence_scores(texts: list[str], nll: SentenceScorer, calibration: Calibration = "none",
                    reference: SentenceScorer | None = None) -> np.ndarray:
    """Higher = more likely a member."""
    if not texts:
        return np.zeros(0)
    values = np.asarray(nll(texts), float)
    summed, tokens = values[:, 0], np.maximum(values[:, 1], 1.0)
    scores: np.ndarray  # numpy types these float-array expressions as Any
    if calibration == "none":
        scores = -summed / tokens
        return scores
    if calibration == "zlib":
        scores = -summed / np.array([zlib_bits(t) for t in texts])
        return scores
    if reference is None:
        raise ValueError("reference calibration needs a reference model")
    ref = np.asarray(reference(texts), float)
    scores = ref[:, 0] / np.maximum(ref[:, 1], 1.0) - summed / tokens
    return scores


def grouped_scores(scores: np.ndarray, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """Mean sentence score of each group (a user's sentences, or the sentences with an entity)."""
    return np.array([float(np.mean(scores[list(g)])) for g in groups if len(g)])


class TooFewCandidates(UedpError):
    """Fewer members or non-members than the configured sample size: the attack is refused rather than
    run on all of them, whose number would be the exact (private) count. The message names the size
    asked for, never the number available."""


def fixed_sample(members: np.ndarray, non_members: np.ndarray, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Exactly ``size`` members and ``size`` non-members, drawn without replacement (seeded); refused
    (:class:`TooFewCandidates`) when either side has fewer."""
    if size < 1:
        raise ValueError(f"the sample size must be at least 1, got {size}")
    if len(members) < size or len(non_members) < size:
        raise TooFewCandidates(f"fewer than {size} members or non-members to sample {size} of each from")
    rng = np.random.default_rng(seed)
    return rng.choice(members, size, replace=False), rng.choice(non_members, size, replace=False)


@dataclass(frozen=True)
class MembershipResult:
    level: str
    calibration: str
    figures: AttackFigures

    def line(self) -> str:
        """e.g. ``user membership AUC 0.61 (95% CI 0.55-0.67; 200 members, 200 non-members)``."""
        f = self.figures
        calibrated = "" if self.calibration == "none" else f" ({self.calibration}-calibrated)"
        return (f"{self.level} membership AUC{calibrated} {f.auc:.2f} (95% CI {f.auc_low:.2f}-{f.auc_high:.2f}; "
                f"{f.members} members, {f.non_members} non-members)")


def membership_attack(level: str, calibration: str, members: np.ndarray, non_members: np.ndarray,
                      size: int, seed: int = 0) -> MembershipResult:
    """The attack on a fixed sample of ``size`` members and ``size`` non-members (:func:`fixed_sample`)."""
    m, n = fixed_sample(members, non_members, size, seed)
    return MembershipResult(level, calibration, attack_figures(m, n))
