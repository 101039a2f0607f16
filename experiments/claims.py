"""The points a page makes, each checked on its own figures, and the verdicts beside the seed paper;
with the canary-exposure rules the privacy claims share."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from uedp.errors import UedpError
from uedp.experiments.common import SCALES, Results, Scale


@dataclass(frozen=True)
class Claim:
    """One point a page makes, checked on its own figures.

    ``statement`` is what we claim; ``seeds`` what the seed paper says on the point; a claim that holds
    ``reproduces`` or ``contradicts`` the seed. ``scales`` are those where the figures are meant to
    show it (the ``ci`` scale is too small for some): the ``ci`` test asserts every claim of its scale.
    """

    statement: str
    seeds: str
    when_holds: Literal["reproduces", "contradicts", "extends"]
    check: Callable[[Results], tuple[bool, str]]  # holds, and our figures in words
    scales: tuple[Scale, ...] = SCALES


@dataclass(frozen=True)
class Verdict:
    statement: str
    seeds: str
    ours: str
    holds: bool
    verdict: str


def judge(claims: Iterable[Claim], results: Results, scale: Scale) -> list[Verdict]:
    out = []
    for claim in claims:
        if scale not in claim.scales:
            continue
        try:
            holds, ours = claim.check(results)
        except UedpError as exc:  # a configuration that did not finish: the claim cannot be judged
            holds, ours = False, f"not measured ({exc})"
        out.append(Verdict(claim.statement, claim.seeds, ours, holds,
                           claim.when_holds if holds else "does not hold at this scale"))
    return out


# --- canary exposure ----------------------------------------------------------------------------------

# A canary ranked at random has exposure 1/ln 2 = 1.44 bits on average, and above x bits with probability
# 2^-x: a few canaries' mean below 4 bits is what an attack that found nothing gives. Claims that compare
# exposures are judged only when the noiseless model's canaries stand above that, and by a margin.
MEASURABLE_EXPOSURE = 4.0
EXPOSURE_MARGIN = 1.0


def exposure_unmeasurable(noiseless: float) -> str | None:
    """Why exposures cannot be compared at this scale (the noiseless model's canaries are not found by the
    attack), or None when they can."""
    if noiseless >= MEASURABLE_EXPOSURE:
        return None
    return (f"not measurable at this scale: the noiseless model's canaries have exposure {noiseless:.2f}, below "
            f"{MEASURABLE_EXPOSURE:g} bits (a random rank gives 1.44 on average): the attack finds nothing to compare")


def clearly_above(higher: float, lower: float) -> bool:
    """``higher`` exceeds ``lower`` by more than the margin one canary's rank moves by chance."""
    return higher > lower + EXPOSURE_MARGIN
