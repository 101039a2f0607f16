"""The one-run privacy audit (Steinke, Nasr, Jagielski, NeurIPS 2023, "Privacy auditing with one (1)
training run"): a lower bound on epsilon from a single training run.

Protocol. m canaries are each put into the training data by an independent fair coin (``S_i = +1``: in,
``-1``: out), secretly. After training, every canary gets a score (higher: looks more like it was in).
The auditor guesses "in" for the ``k_plus`` highest scores, "out" for the ``k_minus`` lowest, and
abstains on the rest: ``r = k_plus + k_minus`` guesses, ``v`` of them correct.

The test. If the mechanism is (epsilon, delta)-DP *for the unit the canaries are planted at*, the number
of correct guesses is stochastically dominated by a binomial with success probability
``p = e^eps / (1 + e^eps)`` (the accuracy of randomized response), up to a delta term (the paper's
Theorem 5.2): for every v,

    P[W >= v] <= P[Binomial(r, p) >= v] + 2 m delta * max_{1 <= i <= v} P[v - i <= Binomial(r, p) < v] / i

That right-hand side is the p-value of observing v correct guesses under the hypothesis "the run is
(epsilon, delta)-DP". The audit's lower bound at confidence ``1 - alpha`` is the largest epsilon whose
p-value is at most alpha: any smaller epsilon is rejected. Guesses must be fixed before the coins are
revealed (``k_plus``, ``k_minus`` chosen in advance, not tuned on the outcome), or the bound is void.

Beside it, :func:`clopper_pearson_bound` gives the classic bound on the same guesses: an
exact confidence interval on the guessing accuracy, turned into epsilon (it treats the guesses as
independent trials, which the coins make them only in the delta = 0 limit; the one-run bound is the
rigorous one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

from uedp.privacy.attacks.metrics import clopper_pearson

DEFAULT_CONFIDENCE = 0.95
EPSILON_SEARCH_MAX = 100.0  # a bound would not exceed this even for a perfect attack at realistic m


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P-value of ``v`` correct guesses out of ``r`` (``m`` canaries) if the run is (epsilon, delta)-DP."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and 0 <= delta <= 1, got {epsilon}, {delta}")
    p = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(binom.sf(v - 1, r, p))  # P[Binomial(r, p) >= v]
    if delta == 0 or v == 0:
        return min(1.0, tail)
    # max over i of P[v - i <= B < v] / i, with the window's mass accumulated downwards from v - 1.
    window = np.cumsum(binom.pmf(np.arange(v - 1, -1, -1), r, p))
    worst = float(np.max(window / np.arange(1, v + 1)))
    return min(1.0, tail + 2 * m * delta * worst)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The largest epsilon that ``v`` correct guesses out of ``r`` reject at ``confidence`` (0: none).

    The p-value grows with epsilon, so the bound is found by bisection (to 1e-4 in epsilon)."""
    alpha = 1 - confidence
    if not 0 < alpha < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if p_value(m, r, v, 0.0, delta) > alpha:
        return 0.0  # the guesses do not even reject epsilon = 0
    low, high = 0.0, EPSILON_SEARCH_MAX
    if p_value(m, r, v, high, delta) <= alpha:
        return high
    while high - low > 1e-4:
        middle = (low + high) / 2
        if p_value(m, r, v, middle, delta) <= alpha:
            low = middle
        else:
            high = middle
    return low


def clopper_pearson_bound(r: int, v: int, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """epsilon >= log(a / (1 - a)) for ``a`` the lower end of a one-sided exact interval on the guessing
    accuracy ``v / r`` (0 when that end is at most a coin flip)."""
    if r == 0:
        return 0.0
    low, _ = clopper_pearson(v, r, 2 * (1 - confidence))  # the lower tail of a two-sided interval at 2 alpha
    return math.log(low / (1 - low)) if low > 0.5 else 0.0


@dataclass(frozen=True)
class OneRunAudit:
    """The outcome of one audit: guesses made and right, and both lower bounds at ``confidence``."""

    canaries: int  # m
    guesses: int  # r = k_plus + k_minus
    correct: int  # v
    epsilon_lower_bound: float  # the one-run bound (rigorous)
    clopper_pearson_bound: float  # the same guesses as independent trials (for comparison)
    delta: float
    confidence: float


def audit(scores: np.ndarray, included: np.ndarray, k_plus: int, k_minus: int, delta: float,
          confidence: float = DEFAULT_CONFIDENCE) -> OneRunAudit:
    """Guess "in" for the ``k_plus`` highest scores and "out" for the ``k_minus`` lowest; bound epsilon.

    ``included`` holds the secret coins (True: the canary was in the training data). Ties in the
    scores are broken by canary order, which the coins do not influence."""
    scores, included = np.asarray(scores, float), np.asarray(included, bool)
    m = len(scores)
    if included.shape != scores.shape:
        raise ValueError("one coin per score")
    if k_plus < 0 or k_minus < 0 or k_plus + k_minus > m:
        raise ValueError(f"need k_plus, k_minus >= 0 with k_plus + k_minus <= m = {m}")
    order = np.argsort(-scores, kind="stable")  # highest first
    guessed_in, guessed_out = order[:k_plus], order[m - k_minus:] if k_minus else order[:0]
    correct = int(included[guessed_in].sum() + (~included[guessed_out]).sum())
    r = k_plus + k_minus
    return OneRunAudit(m, r, correct, epsilon_lower_bound(m, r, correct, delta, confidence),
                       clopper_pearson_bound(r, correct, confidence), delta, confidence)


# Shares of the m canaries guessed on (half "in" from the top, half "out" from the bottom), fixed in
# advance: the audit reports the best of them, each tested at confidence 1 - alpha / len (Bonferroni), so
# the reported bound holds at the stated confidence although the best was picked after seeing the scores.
GUESS_SHARES: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0)


def audit_best(scores: np.ndarray, included: np.ndarray, delta: float, confidence: float = DEFAULT_CONFIDENCE,
               shares: tuple[float, ...] = GUESS_SHARES) -> OneRunAudit:
    """The strongest of :func:`audit` over ``r = share * m`` guesses for each share (``k_plus = k_minus =
    r / 2``), Bonferroni-corrected: the returned bound holds at ``confidence`` overall."""
    m = len(np.asarray(scores))
    counts = sorted({max(1, int(share * m) // 2) for share in shares if share > 0})
    if not counts or m < 2:
        raise ValueError(f"an audit needs at least 2 canaries, got {m}")
    each = 1 - (1 - confidence) / len(counts)
    results = [audit(scores, included, k, k, delta, each) for k in counts if 2 * k <= m]
    best = max(results, key=lambda a: (a.epsilon_lower_bound, a.clopper_pearson_bound))
    cp = max(a.clopper_pearson_bound for a in results)
    return OneRunAudit(best.canaries, best.guesses, best.correct, best.epsilon_lower_bound, cp, delta, confidence)
