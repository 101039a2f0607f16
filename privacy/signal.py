"""The noise-to-signal of one averaged private update: whether a configuration can learn, said before it
spends a budget.

A private round adds Gaussian noise of standard deviation ``sigma = z * sensitivity`` to a sum of at most
``units`` contributions of norm at most ``clip`` each (users' clipped deltas, or examples' clipped
gradients), ``units`` being the expected number per round (``q_user * N`` users, dpsgd's expected batch).
The **noise-to-signal** is ``sigma / (clip * units)``: the noise's standard deviation per coordinate of
the averaged update, in units of the largest norm the averaged signal can have. It is a function of public
settings and of the public or DP count of units only, so printing and logging it releases nothing.

Where learning stops was measured, not derived (docs/results/noise-to-signal: tiny GPT-2 from scratch on
CoNLL-2003 and on generated customer messages): the thresholds below are the ratios past which those runs
no longer beat a unigram model of the validation split. They depend on the model (the noise's norm grows
with the square root of the number of trained weights, which LoRA shrinks), the rounds and the learning
rates, so they are a warning, not a rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

# How the averaged update is applied: server SGD on the average (DP-FedAvg and the uedp mechanisms), or
# Adam on the noised mean gradient (dpsgd, selective), which rescales every coordinate.
UpdateRule = Literal["server-sgd", "adam"]

# Where this project's measured runs stopped beating a unigram model (docs/results/noise-to-signal): on
# CoNLL-2003, userdp was below the unigram (31.7) at 0.031 (25.6) and above it at 0.052 (40.5); dpsgd (300 steps
# of batch 16) was at the unigram's level at 0.031 (32.4) and well below it at 0.017 (600 steps of batch 32,
# docs/results/selective-conll: 20.2). The threshold is the largest ratio at which both still learnt, rounded down.
LEARNING_STOPS_PAST: dict[UpdateRule, float] = {"server-sgd": 0.03, "adam": 0.03}
MEASURED_ON = "docs/results/noise-to-signal"

# What lowers the ratio, by the settings that set it (the warning names those that apply). How a dataset gets
# more users depends on its corpus format (a format with fixed users accepts no --users): the caller that
# knows the dataset says it (MORE_USERS when none is known, as in `uedp epsilon`).
MORE_USERS = "a corpus with more writers"
FIXES: dict[UpdateRule, tuple[str, ...]] = {
    "server-sgd": ("a larger --q-user",),
    "adam": ("a larger --batch-size",),
}
# With a target epsilon the noise multiplier is calibrated: fewer rounds or a larger target lower it. With a
# fixed noise multiplier only a smaller one does (and raises epsilon).
BUDGET_FIXES = {True: ("a smaller --noise-multiplier (a larger epsilon)",),
                False: ("fewer --rounds or --steps", "a larger --target-epsilon")}
PRETRAINING_FIX = "a public-pretrained start (--init-from)"


@dataclass(frozen=True)
class NoiseToSignal:
    """One configuration's averaged update: its noise's std per coordinate beside the signal's largest norm."""

    mechanism: str
    noise_std: float  # std of the noise added to the sum (z times the sensitivity)
    clip: float  # the largest norm of one unit's contribution
    units: float  # expected contributions averaged per round
    rule: UpdateRule
    extra_fixes: tuple[str, ...] = ()  # mechanism-specific ways to lower it (uedp-bounded: a smaller k)
    fixed_noise: bool = False  # z was given (not calibrated to a target epsilon): the fixes differ
    # The update's trainable coordinates (LoRA's adapters only; 0: not known, as in `uedp epsilon`): the
    # noise's norm grows with their square root while the signal's stays at most the clip.
    coordinates: int = 0

    @property
    def norm_ratio(self) -> float | None:
        """The noise's expected norm over the trainable coordinates, in units of the signal's largest norm:
        ``ratio * sqrt(coordinates)`` (None when the coordinates are not known)."""
        return self.ratio * math.sqrt(self.coordinates) if self.coordinates else None

    @property
    def ratio(self) -> float:
        return self.noise_std / (self.clip * self.units)

    @property
    def limit(self) -> float:
        return LEARNING_STOPS_PAST[self.rule]

    @property
    def past_limit(self) -> bool:
        return self.ratio > self.limit

    def line(self) -> str:
        """What the planner prints beside epsilon."""
        per = self.noise_std / self.units
        over = (f"; over its {self.coordinates:,} trainable coordinates the noise's norm is about "
                f"{self.norm_ratio:.3g} times the clip" if self.norm_ratio is not None else "")
        return (f"noise-to-signal {self.ratio:.3g}: one averaged update's noise has std {per:.3g} per coordinate "
                f"beside a signal of norm at most clip = {self.clip:g} ({self.units:.4g} units per round){over}; "
                f"measured runs stopped learning past {self.limit:g} ({MEASURED_ON})")

    def warning(self, more_users: str = MORE_USERS, pretrained: bool = False) -> str | None:
        """Said when the ratio is past the measured threshold, naming what lowers it; ``more_users``: how this
        dataset gets more users, in options its format accepts (averaging over users: server SGD);
        ``pretrained``: the run already starts from a model, so a start is not suggested."""
        if not self.past_limit:
            return None
        users = (f"more users ({more_users})",) if self.rule == "server-sgd" else ()
        fixes = "; ".join((*self.extra_fixes, *users, *FIXES[self.rule], *BUDGET_FIXES[self.fixed_noise],
                           *(() if pretrained else (PRETRAINING_FIX,))))
        return (f"{self.mechanism} is unlikely to learn: noise-to-signal {self.ratio:.3g} is past {self.limit:g}, "
                f"where this project's measured runs stopped beating a unigram model. Lower it with: {fixes}")
