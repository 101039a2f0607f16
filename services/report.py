"""The privacy-utility report of a sweep: utility (perplexity, or classification error) against the
accounted epsilon for every mechanism and entity-category set (the UeDP paper's Fig. 2 and 4), as PNG
plots and a Markdown table, written under the data home and logged to the sweep's parent run."""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
import tempfile
import textwrap
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, ScalarFormatter

from uedp.errors import UedpError
from uedp.services.config import TrainConfig
from uedp.services.tracking import RunTracker
from uedp.services.training import TrainResult
from uedp.services.training_record import logged_baselines
from uedp.storage.home import DataHome


@dataclass(frozen=True)
class ReportRow:
    """One point of the figure: a mechanism x categories x target epsilon, averaged over seeds."""

    mechanism: str
    categories: str
    target_epsilon: float | None
    epsilon: float  # the accounted epsilon (mean over seeds; seeds share it unless calibrated)
    delta: float
    noise_multiplier: float
    metric: str
    valid: float
    test: float
    test_spread: float  # max - min of test utility over seeds
    seeds: int
    run_ids: tuple[str, ...]
    # Local-DP releases (custext, santext): share of train tokens unchanged, mask-token inference success.
    kept_token_share: float | None = None
    mask_inference_success: float | None = None
    randomness: str = "none"
    caveats: tuple[str, ...] = ()
    data_share: float | None = None  # share of training sentences the mechanism may train on (uedp-bounded)
    # The one-run audit's lower bound of each seed's run (runs with audit canaries), None where not audited.
    # Each is a bound at 95% on its own; their mean is not one, so they are shown side by side.
    audit_bounds: tuple[float | None, ...] = ()
    baselines: dict[str, float] = field(default_factory=dict)  # what learning nothing scores on the test split
    unit: str = ""  # the privacy unit its epsilon is for, in the mechanism's own words

    @property
    def audited(self) -> list[float]:
        return [b for b in self.audit_bounds if b is not None]


ANY_CATEGORIES = "any (ignores categories)"


def summarise(outcomes: Iterable[tuple[TrainResult, float | None]]) -> list[ReportRow]:
    """Group ``(result, target epsilon)`` pairs by configuration (everything but the seed: mechanism,
    categories, target and every other setting) and average over seeds only. Configurations shown under one
    name are told apart by the settings in which they differ: ``noiseless (steps=60)``."""
    outcomes = list(outcomes)
    groups: dict[tuple[str, str, float | None, str], list[TrainResult]] = defaultdict(list)
    for result, target in outcomes:
        settings = json.dumps(result.settings, sort_keys=True, default=str)
        groups[(result.shown_as, ",".join(result.categories), target, settings)].append(result)
    names = _configuration_names(groups)
    rows = []
    for key, results in groups.items():
        _, categories, target, _ = key
        mechanism = names[key]
        tests = [r.utility_test for r in results]
        rows.append(ReportRow(
            mechanism=mechanism, categories=categories, target_epsilon=target,
            epsilon=statistics.fmean(r.epsilon for r in results), delta=results[0].delta,
            noise_multiplier=statistics.fmean(r.noise_multiplier for r in results), metric=results[0].utility_metric,
            valid=statistics.fmean(r.utility_valid for r in results), test=statistics.fmean(tests),
            test_spread=max(tests) - min(tests), seeds=len(results), run_ids=tuple(r.run_id for r in results),
            kept_token_share=_mean_of(results, "kept_token_share"),
            mask_inference_success=_mean_of(results, "mask_inference_success"),
            randomness=results[0].randomness, caveats=tuple(dict.fromkeys(c for r in results for c in r.caveats)),
            data_share=_mean_of(results, "data_share_used"), audit_bounds=tuple(r.audit_epsilon for r in results),
            baselines=results[0].baselines, unit=results[0].unit))
    return sorted(rows, key=lambda r: (r.categories, r.mechanism, math.inf if r.target_epsilon is None else r.target_epsilon))


def _configuration_names(groups: dict[tuple[str, str, float | None, str], list[TrainResult]]
                         ) -> dict[tuple[str, str, float | None, str], str]:
    """Each configuration's name in the report: its mechanism's, plus, where several configurations share
    a mechanism, categories and target, the settings that tell them apart."""
    shared: dict[tuple[str, str, float | None], list[tuple[str, str, float | None, str]]] = defaultdict(list)
    for key in groups:
        shared[key[:3]].append(key)
    names = {}
    for (mechanism, _, _), keys in shared.items():
        if len(keys) == 1:
            names[keys[0]] = mechanism
            continue
        settings = [json.loads(key[3]) for key in keys]
        differing = sorted({name for s in settings for name in s if len({json.dumps(o.get(name)) for o in settings}) > 1})
        for key, these in zip(keys, settings):
            names[key] = f"{mechanism} ({', '.join(f'{name}={these.get(name)}' for name in differing)})"
    return names


def _mean_of(results: list[TrainResult], key: str) -> float | None:
    values = [r.privacy_extra[key] for r in results if key in r.privacy_extra]
    return statistics.fmean(values) if values else None


def _num(value: float, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return "inf" if math.isinf(value) else f"{value:.{digits}g}"


def markdown(rows: list[ReportRow], title: str) -> str:
    metric = rows[0].metric if rows else "perplexity"
    lines = [f"# {title}", "",
             f"Utility: test {metric} (lower is better), mean over seeds. Epsilon: accounted by dp_accounting for "
             "each mechanism's own privacy unit (listed below the table); `inf` means no guarantee. Data used: the "
             "share of training sentences a mechanism may train on, where it drops some (`-`: all).", "",
             f"| mechanism | categories | target epsilon | epsilon | audit bound | delta | z | randomness "
             f"| valid {metric} | test {metric} | spread over seeds | seeds | data used | MLflow runs |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r.mechanism} | {r.categories or ANY_CATEGORIES} | {_num(r.target_epsilon) if r.target_epsilon else '-'} "
                     f"| {_num(r.epsilon)} | {' / '.join(_num(b, 3) for b in r.audited) or '-'} | {r.delta:g} "
                     f"| {_num(r.noise_multiplier, 3) if r.noise_multiplier else '-'} "
                     f"| {r.randomness if r.randomness != 'none' else '-'} "
                     f"| {_num(r.valid)} | {_num(r.test)} | {_num(r.test_spread, 2)} | {r.seeds} "
                     f"| {'-' if r.data_share is None else f'{r.data_share:.1%}'} "
                     f"| {' '.join(run[:8] for run in r.run_ids)} |")
    units = {(r.mechanism, r.unit): None for r in rows if r.unit and r.unit != "none"}
    if units:
        lines += ["", "Privacy units (each epsilon is for its mechanism's unit; docs/PRIVACY.md explains each):", ""]
        lines += [f"- {mechanism}: {unit}" for mechanism, unit in units]
    baselines = next((r.baselines for r in rows if r.baselines), None)
    if baselines:
        lines += ["", _baselines_sentence(baselines, metric)]
    if any(r.audited for r in rows):
        lines += ["", "Audit bound: the one-run audit's lower bound on epsilon at 95% confidence (Steinke, Nasr and "
                  "Jagielski 2023) from the canaries planted at each mechanism's unit (`audit_canaries`), one per "
                  "seed. A bound above the accounted epsilon would prove the accounting wrong; a bound far below it "
                  "says only that this attack did not find more."]
    caveats: dict[str, list[str]] = {}
    for r in rows:
        for caveat in r.caveats:
            caveats.setdefault(caveat, []).append(r.mechanism)
    if caveats:
        lines += ["", "What the epsilons do not cover (see docs/PRIVACY.md for each mechanism's unit, adjacency and "
                  "what it treats as public):", ""]
        lines += [f"- {caveat} ({', '.join(dict.fromkeys(mechanisms))})" for caveat, mechanisms in caveats.items()]
    local = [r for r in rows if r.kept_token_share is not None]
    if local:
        lines += ["", "Local-DP releases (epsilon per sanitized token; the thesis' Tables 3.6 and 3.7): share of "
                  "train tokens unchanged after sanitizing, and of tokens a masked LM recovers from the release.", "",
                  "| mechanism | categories | epsilon | tokens unchanged | mask-token inference success |",
                  "|---|---|---:|---:|---:|"]
        lines += [f"| {r.mechanism} | {r.categories or ANY_CATEGORIES} | {_num(r.epsilon)} | {r.kept_token_share:.1%} | "
                  f"{'-' if r.mask_inference_success is None else f'{r.mask_inference_success:.1%}'} |" for r in local]
    return "\n".join(lines) + "\n"


# What each baseline is, in the report's sentence and in the plot's legend, in the order both list them.
_BASELINE_WORDS = {"majority": "always answering its majority class", "uniform": "a uniform guess",
                   "unigram": "a unigram model (token frequencies) fitted on the validation split"}
_BASELINE_LEGEND = {"majority": "majority-class baseline", "uniform": "uniform guess baseline",
                    "unigram": "unigram of the validation split"}


def _in_order(baselines: dict[str, float]) -> list[tuple[str, float]]:
    return [(name, baselines[name]) for name in _BASELINE_WORDS if name in baselines]


def _baselines_sentence(baselines: dict[str, float], metric: str) -> str:
    """A figure means something only beside what a model that learnt nothing scores. Above a language
    model's unigram baseline a model has not even learnt which tokens are common."""
    scores = [f"{_BASELINE_WORDS[name]} gives {metric + ' ' if index == 0 else ''}{value:.4g}"
              for index, (name, value) in enumerate(_in_order(baselines))]
    learnt = "nothing" if metric == "error" else "nothing beyond token frequencies"
    return f"Baselines on the test split: {'; '.join(scores)}. A model at or above these has learnt {learnt}."


def plot(rows: list[ReportRow], path: Path, title: str) -> list[Path]:
    """One PNG per category set (:func:`privacy_utility_figure`)."""
    written = []
    # A mechanism that ignores categories (noiseless, dpsgd, userdp) is trained once and drawn in every set's plot.
    for categories in sorted({r.categories for r in rows if r.categories}) or [""]:
        fig = privacy_utility_figure(rows, categories, title)
        out = path.parent / f"{path.stem}-{_slug(categories)}{path.suffix}"
        fig.savefig(out)
        plt.close(fig)
        written.append(out)
    return written


def unit_label(unit: str) -> str:
    """A privacy unit in a few words, for a panel's title: the mechanism's own words up to their detail
    ("one user (all of their sentences)" -> "one user")."""
    for stop in (" (", ":", ";"):
        unit = unit.split(stop)[0]
    return unit.strip() or "unstated unit"


def privacy_utility_figure(rows: list[ReportRow], categories: str, title: str) -> Figure:
    """Test utility against epsilon for one category set: one panel per privacy unit (an epsilon for one user
    and one for one user and one entity are not on one scale), a line per private mechanism, the
    mechanisms without a guarantee (noiseless, deid) and the baselines as horizontal lines on every panel.

    The epsilon axis starts at 0 unless the points span a decade (then it is logarithmic): runs at 7.993 and
    7.999 sit together near 8, not at the two ends of an axis zoomed onto their difference."""
    subset = [r for r in rows if r.categories in (categories, "")]
    finite = [r for r in subset if math.isfinite(r.epsilon) and math.isfinite(r.test)]
    units = sorted({unit_label(r.unit) for r in finite}) or [""]
    colours = {m: f"C{i % 10}" for i, m in enumerate(sorted({r.mechanism for r in subset}))}
    metric = subset[0].metric if subset else "perplexity"
    baselines = next((r.baselines for r in subset if r.baselines), {})
    references = [r for r in subset if not math.isfinite(r.epsilon) and math.isfinite(r.test)]
    fig, axes = plt.subplots(1, len(units), figsize=(1.2 + 4.8 * len(units), 4.4), dpi=120, sharey=True,
                             squeeze=False)
    for ax, unit in zip(axes[0], units):
        here = [r for r in finite if unit_label(r.unit) == unit]
        for mechanism in sorted({r.mechanism for r in here}):
            points = sorted((r.epsilon, r.test, r.test_spread) for r in here if r.mechanism == mechanism)
            ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] / 2 for p in points],
                        marker="o", capsize=3, color=colours[mechanism], label=mechanism)
        for r in references:
            ax.axhline(r.test, linestyle="--", color=colours[r.mechanism], label=f"{r.mechanism} (no guarantee)")
        for name, value in _in_order(baselines):
            ax.axhline(value, linestyle=":", color="0.6" if name == "uniform" else "0.35", label=_BASELINE_LEGEND[name])
        _epsilon_axis(ax, [r.epsilon for r in here])
        ax.set_xlabel("epsilon (accounted)")
        ax.set_title(textwrap.fill(f"unit: {unit}" if unit else "no private run", 45), fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    # Log scales only across more than a decade: a narrower log axis has no major tick to label, and
    # its minor labels (5.86x10^0, 5.87x10^0, ...) run into each other.
    if metric == "perplexity" and _spans_a_decade([r.test for r in subset if math.isfinite(r.test)]
                                                  + list(baselines.values())):
        axes[0][0].set_yscale("log")
    axes[0][0].set_ylabel(f"test {metric}")
    for ax in axes[0]:
        ax.yaxis.set_major_formatter(ScalarFormatter(useOffset=False))
        ax.yaxis.set_minor_formatter(NullFormatter())
    # Long category lists wrap instead of running off the figure.
    fig.suptitle(f"{title}\n" + textwrap.fill(f"categories: {categories or ANY_CATEGORIES}", 90), fontsize=10)
    fig.tight_layout()
    return fig


def _epsilon_axis(ax: Axes, epsilons: list[float]) -> None:
    """From 0 to a little past the largest epsilon, or logarithmic across more than a decade; plain numbers,
    never an offset ("+7.99") or a scale factor."""
    if _spans_a_decade(epsilons):
        ax.set_xscale("log")
    else:
        ax.set_xlim(0, max([*epsilons, 1.0]) * 1.12)
    ax.xaxis.set_major_formatter(ScalarFormatter(useOffset=False))
    ax.xaxis.set_minor_formatter(NullFormatter())


def plot_audit(rows: list[ReportRow], path: Path, title: str) -> Path | None:
    """The audit bound of every audited run against its accounted epsilon, a marker per mechanism, with
    the line where the bound would equal the epsilon (points above it: the accounting is wrong).
    Mechanisms without a guarantee are dashed horizontal lines at their bound."""
    audited = [r for r in rows if r.audited]
    if not audited:
        return None
    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=120)
    finite = [r for r in audited if math.isfinite(r.epsilon)]
    for index, mechanism in enumerate(sorted({r.mechanism for r in finite})):
        points = [(r.epsilon, b) for r in finite if r.mechanism == mechanism for b in r.audited]
        ax.scatter([p[0] for p in points], [p[1] for p in points], marker="os^Dv<>P"[index % 8], s=60,
                   facecolors="none", edgecolors=f"C{index}", linewidths=1.5, label=mechanism, zorder=3)
    top = max([b for r in audited for b in r.audited] + [r.epsilon for r in finite] + [1.0]) * 1.1
    ax.plot([0, top], [0, top], color="grey", linewidth=1, label="bound = accounted epsilon")
    unbounded: dict[float, list[str]] = {}  # runs without a guarantee, by bound (equal bounds share a line)
    for r in audited:
        if not math.isfinite(r.epsilon):
            unbounded.setdefault(round(max(r.audited), 3), []).append(r.mechanism)
    for index, (bound, names) in enumerate(sorted(unbounded.items())):
        ax.axhline(bound, linestyle="--", color=("black", "C8", "C9", "C5")[index % 4],
                   label=f"{', '.join(names)} (no guarantee)")
    margin = top * 0.03  # points at 0 stay whole above the axis
    ax.set(xlabel="accounted epsilon", ylabel="one-run audit lower bound (95%)", xlim=(-margin, top),
           ylim=(-margin, top), title=f"{title}\naudit bound vs accounted epsilon")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _spans_a_decade(values: list[float]) -> bool:
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return bool(positive) and len(positive) == len(values) and max(positive) >= 10 * min(positive)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_") or "any"


def write_report(rows: list[ReportRow], folder: Path, title: str) -> list[Path]:
    """``report.md`` and one ``privacy_utility-<categories>.png`` per category set under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    plots = plot(rows, folder / "privacy_utility.png", title)
    audit_plot = plot_audit(rows, folder / "audit_vs_epsilon.png", title)
    plots += [audit_plot] if audit_plot is not None else []
    figures = "".join(f"\n![privacy-utility, {p.stem}]({p.name})\n" for p in plots)
    (folder / "report.md").write_text(markdown(rows, title) + figures, encoding="utf-8")
    return [folder / "report.md", *plots]


# --- rebuilding a report from runs already in MLflow -------------------------------------------------
def outcome_of_run(tracker: RunTracker) -> tuple[TrainResult, float | None] | None:
    """A finished training run as the sweep saw it (its result and the target epsilon it was calibrated
    to), read back from its ``resolved_config.json`` and metrics; None for anything else (a sweep's
    parent run, a failed or running one, a run of another tool)."""
    run = tracker.client.get_run(tracker.run_id)
    if run.info.status != "FINISHED" or run.data.tags.get("uedp.kind") == "sweep":
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = tracker.download("resolved_config.json", Path(tmp))
        if path is None:
            return None
        logged = json.loads(path.read_text(encoding="utf-8"))
    try:
        config, privacy = TrainConfig.from_logged(logged["config"]), logged["privacy"]
    except (ValueError, KeyError):  # a run of a uedp whose configuration this one no longer reads: skipped
        return None
    metric = config.utility_metric
    metrics = run.data.metrics  # the latest value of each: the valid figure after the last round
    result = TrainResult(
        run_id=tracker.run_id, mechanism=config.mechanism,
        categories=list(config.categories) if config.spec.uses_categories(config.params) else [],
        epsilon=float(privacy["epsilon"]), delta=float(privacy["delta"]),
        noise_multiplier=float(privacy["noise_multiplier"]), utility_metric=metric,
        utility_valid=float(metrics.get(f"{metric}_valid", math.nan)),
        utility_test=float(metrics.get(f"{metric}_test", math.nan)), rounds=int(privacy["rounds"]),
        notes=str(privacy.get("notes", "")), privacy_extra=dict(privacy.get("extra", {})),
        randomness=str(privacy.get("randomness", "none")), caveats=tuple(privacy.get("caveats", ())),
        public=tuple(privacy.get("public", ())), label=config.label, unit=run.data.params.get("privacy_unit", ""),
        audit_epsilon=metrics.get("audit_one_run_epsilon_lower_bound"),
        detector_recall=run.data.params.get("privacy_detector_recall", ""),
        baselines=logged_baselines(metric, metrics), settings=config.settings())
    return result, (config.params.budget if config.spec.private else None)


def runs_to_report(home: DataHome, dataset: str, parent_run_id: str | None = None,
                   run_ids: list[str] | None = None) -> list[RunTracker]:
    """The runs a rebuilt report covers: the given ones, a sweep's children, or every run of the dataset."""
    if run_ids:
        trackers = [RunTracker.attach(home, run_id) for run_id in run_ids]
        for tracker in trackers:
            tracker.require_run()
        return trackers
    probe = RunTracker.attach(home, parent_run_id or "")
    experiment = probe.client.get_experiment_by_name(dataset)
    if experiment is None:
        raise UedpError(f"no MLflow experiment {dataset!r} in {probe.client.tracking_uri}: nothing was trained on it")
    if parent_run_id:
        probe.require_run()
    query = f"tags.`mlflow.parentRunId` = '{parent_run_id}'" if parent_run_id else ""
    runs = probe.client.search_runs([experiment.experiment_id], filter_string=query, max_results=5000)
    return [RunTracker.attach(home, run.info.run_id) for run in runs if run.data.tags.get("uedp.kind") != "sweep"]


def rebuild_report(home: DataHome, dataset: str, parent_run_id: str | None = None,
                   run_ids: list[str] | None = None, title: str | None = None) -> tuple[list[Path], int, int]:
    """Write the privacy-utility report of runs already in MLflow: a sweep's (under its folder, and logged
    to its parent run again), chosen runs, or all of a dataset's. Returns the files, the runs used and
    the runs skipped (not finished training runs)."""
    trackers = runs_to_report(home, dataset, parent_run_id, run_ids)
    outcomes = [outcome for tracker in trackers if (outcome := outcome_of_run(tracker)) is not None]
    if not outcomes:
        raise UedpError(f"none of the {len(trackers)} runs is a finished training run of {dataset!r}")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    folder = home.reports_dir(dataset) / (parent_run_id or f"rebuilt-{stamp}")
    files = write_report(summarise(outcomes), folder, title or f"uedp runs on {dataset}")
    if parent_run_id:
        parent = RunTracker.attach(home, parent_run_id)
        for path in files:
            parent.log_file(path, "report")
    return files, len(outcomes), len(trackers) - len(outcomes)
