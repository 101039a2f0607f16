"""Scores of a membership attack turned into the figures papers report (ROC AUC, TPR at a fixed low
FPR, balanced accuracy), and the Clopper-Pearson interval other audits build on.

Convention: a higher score means "more likely a member". These figures measure an attack; they bound
no epsilon (:mod:`privacy.attacks.membership` says why; :mod:`privacy.attacks.one_run` does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import beta as beta_dist
from sklearn.metrics import roc_auc_score, roc_curve


@dataclass(frozen=True)
class AttackFigures:
    auc: float
    tpr_at_1pct_fpr: float
    tpr_at_01pct_fpr: float
    balanced_accuracy: float
    members: int
    non_members: int

    def as_metrics(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}_auc": self.auc, f"{prefix}_tpr_at_1pct_fpr": self.tpr_at_1pct_fpr,
                f"{prefix}_tpr_at_0.1pct_fpr": self.tpr_at_01pct_fpr,
                f"{prefix}_balanced_accuracy": self.balanced_accuracy}


def attack_figures(member_scores: np.ndarray, non_member_scores: np.ndarray) -> AttackFigures:
    """ROC AUC, TPR at 1% and 0.1% FPR, and the best balanced accuracy over thresholds."""
    member_scores, non_member_scores = np.asarray(member_scores, float), np.asarray(non_member_scores, float)
    if not len(member_scores) or not len(non_member_scores):
        raise ValueError("an attack needs at least one member and one non-member")
    labels = np.r_[np.ones(len(member_scores)), np.zeros(len(non_member_scores))]
    scores = np.r_[member_scores, non_member_scores]
    fpr, tpr, _ = roc_curve(labels, scores)
    return AttackFigures(
        auc=float(roc_auc_score(labels, scores)),
        tpr_at_1pct_fpr=_tpr_at(fpr, tpr, 0.01), tpr_at_01pct_fpr=_tpr_at(fpr, tpr, 0.001),
        balanced_accuracy=float(np.max((tpr + 1 - fpr) / 2)),
        members=len(member_scores), non_members=len(non_member_scores))


def _tpr_at(fpr: np.ndarray, tpr: np.ndarray, max_fpr: float) -> float:
    """The largest TPR among thresholds whose FPR does not exceed ``max_fpr`` (0 when none)."""
    allowed = tpr[fpr <= max_fpr]
    return float(allowed.max()) if len(allowed) else 0.0


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Two-sided exact binomial confidence interval at level ``1 - alpha``."""
    low = 0.0 if successes == 0 else float(beta_dist.ppf(alpha / 2, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(beta_dist.ppf(1 - alpha / 2, successes + 1, trials - successes))
    return low, high
