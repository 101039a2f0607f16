"""Scores of a membership attack turned into the figures papers report (ROC AUC, TPR at a fixed low
FPR, balanced accuracy) and into an empirical lower bound on epsilon.

Convention: a higher score means "more likely a member".

The lower bound (Jagielski et al. 2020; Nasr et al. 2021): any (epsilon, delta)-DP mechanism forces
every test of "member vs non-member" to satisfy ``TPR <= e^eps FPR + delta`` and
``1 - FPR <= e^eps (1 - TPR) + delta``. With Clopper-Pearson bounds at confidence ``1 - alpha`` on
the observed rates (a lower bound on TPR, an upper bound on FPR), ``eps >= log((TPR_lo - delta) / FPR_hi)``
holds with that confidence. The threshold is chosen on one half of the scores and evaluated on the
other, so choosing it does not inflate the bound. A bound above the accounted epsilon is a bug.
"""

from __future__ import annotations

import math
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


@dataclass(frozen=True)
class EpsilonLowerBound:
    epsilon: float  # 0 when the attack proves nothing
    threshold: float
    tpr: float
    fpr: float
    confidence: float


def epsilon_lower_bound(member_scores: np.ndarray, non_member_scores: np.ndarray, delta: float,
                        alpha: float = 0.05, seed: int = 0) -> EpsilonLowerBound:
    """An epsilon no mechanism with the given delta can be below, at confidence ``1 - alpha``.

    Scores are split at random into a half that picks the threshold (best point estimate of the bound)
    and a half that measures TPR and FPR for the confidence interval.
    """
    rng = np.random.default_rng(seed)
    members, non_members = rng.permutation(np.asarray(member_scores, float)), rng.permutation(np.asarray(non_member_scores, float))
    m_pick, m_eval = members[: len(members) // 2], members[len(members) // 2:]
    n_pick, n_eval = non_members[: len(non_members) // 2], non_members[len(non_members) // 2:]
    if not (len(m_pick) and len(n_pick)):
        raise ValueError("the audit needs at least two members and two non-members")
    candidates = np.unique(np.r_[m_pick, n_pick])
    best, best_threshold = -math.inf, float(candidates[-1]) if len(candidates) else 0.0
    for threshold in candidates:
        estimate = _bound(float(np.mean(m_pick >= threshold)), float(np.mean(n_pick >= threshold)), delta)
        if estimate > best:
            best, best_threshold = estimate, float(threshold)
    tp, fp = int(np.sum(m_eval >= best_threshold)), int(np.sum(n_eval >= best_threshold))
    # One tail (alpha / 2) of each two-sided interval is used: confidence 1 - alpha by the union bound.
    tpr_low, _ = clopper_pearson(tp, len(m_eval), alpha)
    _, fpr_high = clopper_pearson(fp, len(n_eval), alpha)
    # TPR <= e^eps FPR + delta, and TNR <= e^eps FNR + delta, each at its worst end of the intervals.
    epsilon = max(0.0, _ratio_bound(tpr_low, fpr_high, delta), _ratio_bound(1 - fpr_high, 1 - tpr_low, delta))
    return EpsilonLowerBound(epsilon, best_threshold, tp / len(m_eval), fp / len(n_eval), 1 - alpha)


def _ratio_bound(numerator: float, denominator: float, delta: float) -> float:
    if numerator - delta <= 0 or denominator <= 0:
        return 0.0
    return math.log((numerator - delta) / denominator)


def _bound(tpr: float, fpr: float, delta: float) -> float:
    return max(_ratio_bound(tpr, max(fpr, 1e-12), delta), _ratio_bound(1 - fpr, max(1 - tpr, 1e-12), delta))
