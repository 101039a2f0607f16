"""Cross-run composition: the guarantee of several releases from the same text, for the privacy ledger."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from uedp.privacy.accounting.memo import remembered


def compose_guarantees(guarantees: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The ``(epsilon, delta)`` of running mechanisms that are each ``(epsilon_i, delta_i)``-DP for the same
    unit and adjacency, in any order and chosen adaptively (runs on one dataset: the privacy ledger).

    Each guarantee becomes the privacy loss distribution of the worst mechanism it allows
    (``dp_accounting``'s ``from_privacy_parameters``, pessimistically discretised) and dp_accounting
    composes them; the total is read at ``delta = sum(delta_i)``. That is the optimal composition of the
    stated guarantees (Kairouz, Oh and Viswanath 2015), never worse than adding the epsilons, and it
    needs nothing about the runs but what they stated. An infinite epsilon (a run without a guarantee)
    makes the total infinite; no guarantee composes to ``(0, 0)``.

    The composed epsilon is remembered by the stated guarantees (:mod:`.memo`, the data home's cache), so
    ``uedp budget`` of a ledger seen before neither imports nor runs dp_accounting.
    """
    if not guarantees:
        return 0.0, 0.0
    delta = float(sum(d for _, d in guarantees))
    if any(math.isinf(e) for e, _ in guarantees):
        return math.inf, delta
    if len(guarantees) == 1:
        return float(guarantees[0][0]), delta
    stated = tuple((float(e), float(d)) for e, d in guarantees)
    return float(remembered("composition", (stated,), lambda: _composed_epsilon(stated, delta))), delta


def _composed_epsilon(guarantees: tuple[tuple[float, float], ...], delta: float) -> float:
    from dp_accounting import pld

    distributions = [pld.privacy_loss_distribution.from_privacy_parameters(
        pld.common.DifferentialPrivacyParameters(e, d)) for e, d in guarantees]
    composed = functools.reduce(lambda a, b: a.compose(b), distributions)
    # The discretisation rounds each loss up, so the composed figure may sit a hair above the plain sum,
    # which is itself a valid bound: report the smaller.
    return min(float(composed.get_epsilon_for_delta(delta)), float(sum(e for e, _ in guarantees)))
