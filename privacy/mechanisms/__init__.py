"""Mechanism registry: the mechanisms users can run. ``selective`` is the two-phase form for
transformers; the recurrent Selective-DPSGD arrives with the LSTM model."""

from __future__ import annotations

MECHANISMS: dict[str, str] = {
    "noiseless": "no privacy (epsilon = inf); the utility ceiling",
    "deid": "detected spans replaced by [CATEGORY] placeholders, then noiseless (epsilon = inf)",
    "dpsgd": "example-level DP-SGD (one sequence is the unit), per-example gradients by Opacus",
    "selective": "Selective DP, two-phase for transformers: noiseless on redacted text, then DP-SGD",
    "userdp": "user-level DP by DP-FedAvg: per-user model deltas clipped and noised (PRIVACY.md)",
    "uedp": "user- and entity-level DP (UeDP-Alg, estimator f_E+), with sound accounting (PRIVACY.md)",
    "uedp-naive": "UeDP-Alg with the naive estimator f_E: sensitive sentences only",
    "custext": "local DP: each train token replaced by the exponential mechanism over its K-token output set "
               "(CusText), then noiseless",
    "santext": "local DP: each train token replaced by the exponential mechanism over the vocabulary (SanText), "
               "then noiseless",
}
