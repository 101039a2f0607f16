"""Results as people read them in a terminal: the demo's summary table, a run's guarantee, and the
baselines an error rate means something only beside."""

from __future__ import annotations

import math
from typing import Any

import typer

from uedp.commands.common import PRIVACY_DOC, short_number


def print_summary(runs: list[Any], title: str = "uedp demo results") -> None:
    from rich.console import Console
    from rich.table import Table

    metric = runs[0].utility_metric if runs else "perplexity"
    table = Table(title=f"{title} (test {metric}; epsilon for the mechanism's privacy unit)")
    for column in ("mechanism", "categories", "epsilon", "delta", "z", "randomness", "rounds", metric, "MLflow run"):
        table.add_column(column, justify="right" if column in ("epsilon", "delta", "z", "rounds", metric) else "left")
    for r in runs:
        table.add_row(
            r.shown_as, ",".join(r.categories) or "any", short_number(r.epsilon), f"{r.delta:g}" if r.delta else "-",
            f"{r.noise_multiplier:.3g}" if r.noise_multiplier else "-", r.randomness if r.randomness != "none" else "-",
            str(r.rounds), f"{r.utility_test:.4g}", r.run_id,
        )
    Console(width=160).print(table)
    if baselines := next((r.baselines for r in runs if r.baselines), None):
        typer.echo(baselines_line(baselines, metric))
    for r in runs:
        if (warning := baseline_warning(f"{r.shown_as} (categories {','.join(r.categories) or 'any'})", r)) is not None:
            typer.echo(f"warning: {warning}", err=True)
    for label, unit in dict.fromkeys((r.shown_as, r.unit) for r in runs if r.unit and math.isfinite(r.epsilon)):
        typer.echo(f"unit ({label}): {unit}")
    for r in runs:
        if r.notes:
            typer.echo(f"note ({r.mechanism}): {r.notes}")
    caveats = dict.fromkeys(c for r in runs for c in r.caveats)  # shared caveats once, in order
    for caveat in caveats:
        typer.echo(f"not covered by epsilon: {caveat}")
    if any(math.isfinite(r.epsilon) for r in runs):
        typer.echo(f"what each epsilon means (unit, adjacency, what is public): {PRIVACY_DOC}")


def print_guarantee(result: Any) -> None:
    """What a single run's epsilon treats as public and does not cover, next to it."""
    if not math.isfinite(result.epsilon):
        return
    if result.unit:
        typer.echo(f"unit: {result.unit}")
    for line in result.public:
        typer.echo(f"public: {line}")
    for caveat in result.caveats:
        typer.echo(f"not covered by epsilon: {caveat}")
    typer.echo(f"what this epsilon means: {PRIVACY_DOC}")


# Each baseline as the lines below name it, in the order they list it.
_BASELINE_NAMES = {"majority": "majority class", "uniform": "uniform guess",
                   "unigram": "unigram (fitted on the validation split)"}


def baselines_line(baselines: dict[str, float], metric: str) -> str:
    """A test figure means something only beside what a model that learnt nothing scores."""
    figures = ", ".join(f"{_BASELINE_NAMES[name]} {metric} {baselines[name]:.4g}"
                        for name in _BASELINE_NAMES if name in baselines)
    learnt = "" if metric == "error" else "; a model at or above these has learnt nothing beyond token frequencies"
    return f"baselines on the test split: {figures}{learnt}"


def baseline_warning(name: str, result: Any) -> str | None:
    """The warning for a run whose test figure is no better than a uniform guess (it learnt nothing) or,
    for a language model, worse than a unigram (it has not even learnt which tokens are common)."""
    metric, test, baselines = result.utility_metric, result.utility_test, result.baselines
    if "uniform" in baselines and test >= baselines["uniform"]:
        return (f"{name} is no better than a uniform guess (test {metric} {test:.4g} >= {baselines['uniform']:.4g}): "
                "it has learnt nothing")
    if "unigram" in baselines and test > baselines["unigram"]:
        return (f"{name} is worse than a unigram model fitted on the validation split (test {metric} {test:.4g} > "
                f"{baselines['unigram']:.4g}): it has not even learnt which tokens are common")
    return None
