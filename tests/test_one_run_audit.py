"""The one-run audit (Steinke, Nasr, Jagielski 2023): its p-value against an independent computation,
its validity (an epsilon-DP guesser is not caught above epsilon more often than the confidence allows),
its power (a leaky one is), and the guessing protocol."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from uedp.privacy.attacks.one_run import audit, clopper_pearson_bound, epsilon_lower_bound, p_value


def _binomial_tail(r: int, v: int, p: float) -> float:
    """P[Binomial(r, p) >= v] by the sum of its terms, in exact rationals where p is."""
    q = Fraction(p)
    return float(sum(math.comb(r, j) * q**j * (1 - q) ** (r - j) for j in range(v, r + 1)))


def _independent_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The theorem's bound written out term by term (no cumulative sums, no scipy)."""
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    mass = [math.comb(r, j) * p**j * (1 - p) ** (r - j) for j in range(r + 1)]
    worst = max((sum(mass[v - i:v]) / i for i in range(1, v + 1)), default=0.0)
    return min(1.0, _binomial_tail(r, v, p) + 2 * m * delta * worst)


@pytest.mark.parametrize(("m", "r", "v", "epsilon", "delta"), [
    (100, 20, 15, 0.5, 0.0), (1000, 100, 70, 1.0, 1e-5), (1000, 100, 95, 2.0, 1e-3), (50, 50, 25, 0.0, 1e-2),
    (200, 40, 0, 1.0, 1e-5), (500, 60, 60, 3.0, 1e-6),
])
def test_the_p_value_equals_the_theorem_computed_independently(m: int, r: int, v: int, epsilon: float,
                                                               delta: float) -> None:
    assert p_value(m, r, v, epsilon, delta) == pytest.approx(_independent_p_value(m, r, v, epsilon, delta),
                                                             rel=1e-9, abs=1e-12)


def test_the_p_value_grows_with_epsilon_and_delta() -> None:
    values = [p_value(1000, 100, 80, e, 1e-5) for e in (0.0, 0.5, 1.0, 2.0, 4.0)]
    assert values == sorted(values) and values[0] < 1e-3 < 0.5 < values[-1]
    assert p_value(1000, 100, 80, 1.0, 1e-3) > p_value(1000, 100, 80, 1.0, 0.0)


def test_all_guesses_right_gives_the_closed_form_bound_without_delta() -> None:
    """delta = 0, v = r: p-value p^r <= 0.05 exactly when epsilon <= log(a / (1 - a)), a = 0.05^(1/r)."""
    a = 0.05 ** (1 / 100)
    assert epsilon_lower_bound(1000, 100, 100, 0.0) == pytest.approx(math.log(a / (1 - a)), abs=1e-3)
    assert epsilon_lower_bound(1000, 100, 50, 1e-5) == 0.0  # a coin's accuracy proves nothing


def _randomized_response_scores(rng: np.random.Generator, coins: np.ndarray, epsilon: float) -> np.ndarray:
    """An epsilon-DP view of each coin (kept with probability e^eps / (1 + e^eps)), ties broken by noise
    that does not depend on the coin: the strongest scores an epsilon-DP mechanism can give."""
    keep = rng.random(len(coins)) < math.exp(epsilon) / (1 + math.exp(epsilon))
    return np.where(keep, coins, ~coins).astype(float) + rng.uniform(0, 0.1, len(coins))


def test_an_epsilon_dp_guesser_is_rarely_caught_above_its_epsilon_and_often_near_it() -> None:
    rng = np.random.default_rng(7)
    bounds = []
    for _ in range(60):
        coins = rng.random(1000) < 0.5
        bounds.append(audit(_randomized_response_scores(rng, coins, 1.0), coins, 200, 200, 1e-5).epsilon_lower_bound)
    assert np.mean(np.array(bounds) > 1.0) <= 0.15  # valid: 5% expected at 95% confidence
    assert np.mean(bounds) > 0.4  # and not vacuous


def test_a_leaky_run_is_caught_and_an_oblivious_one_is_not() -> None:
    rng = np.random.default_rng(3)
    coins = rng.random(1000) < 0.5
    leaky = audit(coins + rng.normal(0, 0.05, 1000), coins, 100, 100, 1e-5)  # the score is the coin
    assert leaky.correct == leaky.guesses == 200 and leaky.epsilon_lower_bound > 3
    assert 0 < leaky.clopper_pearson_bound < math.inf
    caught = sum(audit(rng.random(400), rng.random(400) < 0.5, 40, 40, 1e-5).epsilon_lower_bound > 0
                 for _ in range(100))
    assert caught <= 12  # scores that ignore the coins: rejected epsilon = 0 in about 5% of audits


def test_guesses_are_the_highest_and_lowest_scores() -> None:
    scores = np.array([0.9, 0.1, 0.5, 0.8, 0.2])
    coins = np.array([True, False, True, False, False])
    result = audit(scores, coins, k_plus=2, k_minus=2, delta=0.0)
    # in: 0.9 (right), 0.8 (wrong); out: 0.1 (right), 0.2 (right)
    assert (result.canaries, result.guesses, result.correct) == (5, 4, 3)
    with pytest.raises(ValueError, match="k_plus"):
        audit(scores, coins, 4, 2, 0.0)
    assert clopper_pearson_bound(0, 0) == 0.0
