"""Mechanism registry. A name here is a mechanism users can run today; PRIVACY.md lists the rest
(dpsgd, selective), which arrive with the rest of the privacy-core issue."""

from __future__ import annotations

MECHANISMS: dict[str, str] = {
    "noiseless": "no privacy (epsilon = inf); the utility ceiling",
    "deid": "detected spans replaced by [CATEGORY] placeholders, then noiseless (epsilon = inf)",
    "userdp": "user-level DP by DP-FedAvg: per-user model deltas clipped and noised (PRIVACY.md)",
    "uedp": "user- and entity-level DP (UeDP-Alg, estimator f_E+), with sound accounting (PRIVACY.md)",
    "uedp-naive": "UeDP-Alg with the naive estimator f_E: sensitive sentences only",
}
