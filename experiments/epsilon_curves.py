"""Epsilon against rounds (the UeDP paper's Fig. 4), shared by its CoNLL and AG News pages, and the two
claims both pages judge on it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from uedp.experiments.common import Results
from uedp.experiments.page import number

Curves = dict[str, list[list[float]]]  # {mechanism: [[T, epsilon], ...]}


def epsilon_curves(mechanisms: Sequence[str], users: int, rounds: Sequence[int],
                   settings_of: Callable[[str], dict[str, Any]]) -> Curves:
    """Each mechanism's sound epsilon (delta 1e-5) after T rounds, with ``users`` declared public (the
    paper's |U|), planned as ``uedp epsilon`` plans it; ``settings_of(mechanism)``: its rates and z."""
    from uedp.privacy.mechanisms import registry
    from uedp.privacy.population import Population
    from uedp.services.config import TrainConfig

    curves: Curves = {}
    for mechanism in mechanisms:
        points = []
        for t in rounds:
            params = TrainConfig.model_validate(dict(dataset="plan", mechanism=mechanism, rounds=t,
                                                     **settings_of(mechanism))).params
            plan = registry.get(mechanism).quote(params, Population.declared(users))  # type: ignore[misc]
            points.append([float(t), float(plan.epsilon)])
        curves[mechanism] = points
    return curves


def epsilon_at(curves: Curves, mechanism: str, t: float) -> float:
    return next(e for r, e in curves[mechanism] if r == t)


def epsilon_curves_figure(curves: Curves, paper_at_50: Mapping[str, float], title: str,
                          label: Callable[[str], str] = str, markersize: int = 3) -> Any:
    """Epsilon against rounds on log axes, one line per mechanism (uedp-naive dashed where it equals uedp),
    and the paper's figure at T = 50 as a cross beside each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for index, mechanism in enumerate(curves):
        points = curves[mechanism]
        same = mechanism == "uedp-naive" and all(math.isclose(a[1], b[1], rel_tol=1e-6)
                                                 for a, b in zip(points, curves["uedp"]))
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=markersize,
                color=f"C{index + 2}", linestyle="--" if same else "-", linewidth=2.5 if mechanism == "uedp" else 1.5,
                label=f"{label(mechanism)} (sound{'; equal to uedp' if same else ''})")
        if mechanism in paper_at_50:
            ax.plot(50, paper_at_50[mechanism], marker="x", markersize=10, mew=2, color=f"C{index + 2}",
                    linestyle="none", label=f"paper's {mechanism} at T = 50: {paper_at_50[mechanism]}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.get_xaxis(), ax.get_yaxis()):
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set(xlabel="rounds T", ylabel="epsilon at delta 1e-5 (log scale)", title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def uedp_above_userdp_at_50(r: Results) -> tuple[bool, str]:
    """The claim both UeDP pages judge: with sound accounting, uedp costs more epsilon than userdp at T = 50."""
    curves = r.figures["epsilon_curves"]
    u, n, d = (epsilon_at(curves, m, 50) for m in ("uedp", "uedp-naive", "userdp"))
    return u > d, f"uedp {number(u)}, uedp-naive {number(n)}, userdp {number(d)}"


def plus_no_worse_than_naive(r: Results) -> tuple[bool, str]:
    """The other: uedp (f_E+) never costs more than uedp-naive (f_E), at every round count of the curves."""
    curves = r.figures["epsilon_curves"]
    pairs = [(t, e, epsilon_at(curves, "uedp-naive", t)) for t, e in curves["uedp"]]
    equal = sum(1 for _, a, b in pairs if math.isclose(a, b, rel_tol=1e-3))
    return all(a <= b * (1 + 1e-9) for _, a, b in pairs), \
        f"uedp <= uedp-naive at all {len(pairs)} round counts ({equal} equal: the entity case dominates both)"
