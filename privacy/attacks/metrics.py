"""Scores of a membership attack turned into the figures papers report (ROC AUC with its 95% interval,
TPR at a fixed low FPR, balanced accuracy), and the Clopper-Pearson interval other audits build on.

Convention: a higher score means "more likely a member". These figures measure an attack; they bound
no epsilon (:mod:`privacy.attacks.membership` says why; :mod:`privacy.attacks.one_run` does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import beta as beta_dist
from scipy.stats import norm
from sklearn.metrics import roc_auc_score, roc_curve


@dataclass(frozen=True)
class AttackFigures:
    auc: float
    tpr_at_1pct_fpr: float
    tpr_at_01pct_fpr: float
    balanced_accuracy: float
    members: int
    non_members: int
    auc_low: float = 0.0  # the AUC's 95% interval (:func:`auc_interval`)
    auc_high: float = 1.0

    def as_metrics(self, prefix: str) -> dict[str, float]:
        """The figures as MLflow metrics; the counts are the caller's to release (they are private where
        the candidates are every training unit rather than a sample of a configured size)."""
        return {f"{prefix}_auc": self.auc, f"{prefix}_auc_low": self.auc_low, f"{prefix}_auc_high": self.auc_high,
                f"{prefix}_tpr_at_1pct_fpr": self.tpr_at_1pct_fpr, f"{prefix}_tpr_at_0.1pct_fpr": self.tpr_at_01pct_fpr,
                f"{prefix}_balanced_accuracy": self.balanced_accuracy}


def attack_figures(member_scores: np.ndarray, non_member_scores: np.ndarray) -> AttackFigures:
    """ROC AUC, TPR at 1% and 0.1% FPR, and the best balanced accuracy over thresholds."""
    member_scores, non_member_scores = np.asarray(member_scores, float), np.asarray(non_member_scores, float)
    if not len(member_scores) or not len(non_member_scores):
        raise ValueError("an attack needs at least one member and one non-member")
    labels = np.r_[np.ones(len(member_scores)), np.zeros(len(non_member_scores))]
    scores = np.r_[member_scores, non_member_scores]
    fpr, tpr, _ = roc_curve(labels, scores)
    auc = float(roc_auc_score(labels, scores))
    low, high = auc_interval(auc, len(member_scores), len(non_member_scores))
    return AttackFigures(
        auc=auc, tpr_at_1pct_fpr=_tpr_at(fpr, tpr, 0.01), tpr_at_01pct_fpr=_tpr_at(fpr, tpr, 0.001),
        balanced_accuracy=float(np.max((tpr + 1 - fpr) / 2)),
        members=len(member_scores), non_members=len(non_member_scores), auc_low=low, auc_high=high)


def auc_interval(auc: float, members: int, non_members: int, level: float = 0.95) -> tuple[float, float]:
    """A two-sided ``level`` confidence interval for a ROC AUC: ``auc`` plus or minus the normal quantile
    times the standard error of Hanley and McNeil (1982, "The meaning and use of the area under a receiver
    operating characteristic (ROC) curve", Radiology 143(1):29-36, equation 2), clipped to [0, 1]:

        SE^2 = (A(1 - A) + (n1 - 1)(Q1 - A^2) + (n2 - 1)(Q2 - A^2)) / (n1 n2),  Q1 = A/(2 - A),  Q2 = 2A^2/(1 + A)

    with n1 members (the positives) and n2 non-members. An approximation (it assumes scores whose
    distributions make Q1 and Q2 as above); it narrows as 1/sqrt(n) and is 0 wide at an AUC of 0 or 1."""
    if members < 1 or non_members < 1:
        raise ValueError("an AUC interval needs at least one member and one non-member")
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    variance = (auc * (1 - auc) + (members - 1) * (q1 - auc**2) + (non_members - 1) * (q2 - auc**2)) / (
        members * non_members)
    half = float(norm.ppf(0.5 + level / 2)) * float(np.sqrt(max(variance, 0.0)))
    return max(0.0, auc - half), min(1.0, auc + half)


def _tpr_at(fpr: np.ndarray, tpr: np.ndarray, max_fpr: float) -> float:
    """The largest TPR among thresholds whose FPR does not exceed ``max_fpr`` (0 when none)."""
    allowed = tpr[fpr <= max_fpr]
    return float(allowed.max()) if len(allowed) else 0.0


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Two-sided exact binomial confidence interval at level ``1 - alpha``."""
    low = 0.0 if successes == 0 else float(beta_dist.ppf(alpha / 2, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(beta_dist.ppf(1 - alpha / 2, successes + 1, trials - successes))
    return low, high
