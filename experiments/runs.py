"""A page's runs: one real ``sweep_flow`` per set of configurations (finished runs reused), and the
figures read back from the data home's MLflow store."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from uedp.errors import UedpError
from uedp.experiments.common import Context, RunRow
from uedp.storage.home import DataHome


def run_sweep(ctx: Context, config: Any, family: str, start: str = "scratch") -> list[RunRow]:
    """One ``sweep_flow``; every configuration must finish (a reproduction with a hole is not a result).
    A configuration this data home already trained to the end is reused, not trained again
    (``reuse_finished``): a page stopped halfway continues where it stopped. ``start``: what the runs
    start from, as the shared rows name it."""
    from uedp.flows.sweep import sweep_flow
    from uedp.services.sweep import SweepFailed

    config = config.model_copy(update={"reuse_finished": True})
    try:
        outcome = sweep_flow(config, progress=True)
    except SweepFailed as exc:
        raise UedpError(f"{ctx.name}: {exc}") from None
    names = run_names_and_seconds(ctx.home, [r.run_id for r in outcome.runs])
    per_byte = logged_figures(ctx.home, [r.run_id for r in outcome.runs], PER_BYTE)
    items = config.items()
    planned = {item.config.run_name(): item for item in items}
    # A reused run may carry the shorter name an older uedp gave it: taken only where one configuration has it.
    short = Counter(item.config.run_name(with_length=False) for item in items)
    planned |= {name: item for item in items if short[name := item.config.run_name(with_length=False)] == 1
                and name not in planned}
    rows = []
    for result in outcome.runs:
        name, seconds = names.get(result.run_id, ("", math.nan))
        extra = {k: float(v) for k, v in result.privacy_extra.items() if isinstance(v, (int, float))}
        extra |= per_byte.get(result.run_id, {})
        item = planned.get(name)
        rows.append(RunRow(result.shown_as, family, item.target if item else None, result.epsilon, result.utility_test,
                           seconds, result.run_id, extra, result.mechanism,
                           _variant(item.config) if item else "", item.config.seed if item else None, start))
    return rows


def _variant(config: Any) -> str:
    """What tells a run apart beyond its mechanism, as the shared rows say it: the rest of its label
    (uedp-bounded's ``k4``, a grid's values) and LoRA's rank."""
    rest = config.label[len(config.mechanism):].strip("-")
    return "-".join(part for part in (rest, f"lora{config.lora_rank}" if config.lora_rank else "") if part)


SHARED_ROW_KEYS = ("corpus", "mechanism", "variant", "start", "target_epsilon", "seed", "perplexity_test")


def shared_rows(runs: Iterable[RunRow], corpus: str) -> list[dict[str, Any]]:
    """Every page's runs in the keys the user-level page's ``rows`` carry (``SHARED_ROW_KEYS``, then the
    accounted epsilon, the run and its minutes), so one reader compares pages; rows of a page made before
    the keys existed have no mechanism and are left out."""
    return [{"corpus": corpus, "mechanism": r.mechanism, "variant": r.variant, "start": r.start,
             "target_epsilon": r.target, "seed": r.seed, "perplexity_test": r.perplexity, "epsilon": r.epsilon,
             "family": r.family, "run_id": r.run_id, "minutes": r.seconds / 60} for r in runs if r.mechanism]


def run_names_and_seconds(home: DataHome, run_ids: list[str]) -> dict[str, tuple[str, float]]:
    """Each run's name and wall time (MLflow's start and end times)."""
    from mlflow.tracking import MlflowClient

    from uedp.services.tracking import tracking_uri

    client = MlflowClient(tracking_uri=tracking_uri(home))
    out = {}
    for run_id in run_ids:
        info = client.get_run(run_id).info
        seconds = (info.end_time - info.start_time) / 1000 if info.end_time and info.start_time else math.nan
        out[run_id] = (info.run_name or "", seconds)
    return out


# A language model's test figures in bits per byte (services.training_run): pages that set starts of different
# vocabularies side by side compare them on these.
PER_BYTE = ("bits_per_byte_test", "bits_per_byte_test_start", "bytes_scored_test")


def logged_figures(home: DataHome, run_ids: list[str], names: Sequence[str]) -> dict[str, dict[str, float]]:
    """Each run's logged metrics of ``names`` (those it has: a run made before a metric existed lacks it)."""
    from mlflow.tracking import MlflowClient

    from uedp.services.tracking import tracking_uri

    client = MlflowClient(tracking_uri=tracking_uri(home))
    out = {}
    for run_id in run_ids:
        metrics = client.get_run(run_id).data.metrics
        out[run_id] = {name: float(metrics[name]) for name in names if name in metrics}
    return out


def mlflow_client(home: Path) -> Any:
    """An MLflow client on the tracking store of a page's data home, where the runs of its commands went
    (services.tracking decides where that is: the home's own store, or ``MLFLOW_TRACKING_URI``)."""
    from mlflow.tracking import MlflowClient

    from uedp.services.tracking import tracking_uri

    return MlflowClient(tracking_uri=tracking_uri(DataHome.from_env(home)))


def finished_runs(home: Path, dataset: str) -> list[Any]:
    """The finished MLflow runs of ``dataset`` in a page's data home, latest first (none before its first run)."""
    client = mlflow_client(home)
    experiment = client.get_experiment_by_name(dataset)
    if experiment is None:
        return []
    return [run for run in client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"])
            if run.info.status == "FINISHED"]


CANARY_FIGURES = ("canary_exposure_mean", "canary_exposure_max", "canary_exposure_min", "canary_count")


def canary_figures(ctx: Context, run_id: str, seed: int = 0) -> dict[str, float]:
    """A run's canary exposures (``uedp attack --kind canary``): read back from the run when this data home
    attacked it before with the same seed, else attacked now (and logged to the run by the attack). A page
    interrupted after some of its attacks goes on without scoring their candidates again: from a 135M-parameter
    start one attack scores tens of thousands of candidate sentences, tens of minutes on a CPU."""
    from uedp.services.attack import attack_run

    run = mlflow_client(ctx.home.root).get_run(run_id)
    logged, tags = run.data.metrics, run.data.tags
    # The run's last attack was a canary attack with this seed (a later attack of another kind or seed re-tags
    # the run: then the figures are measured again rather than trusted).
    last = tags.get("uedp.attack.seed") == str(seed) and "canary" in tags.get("uedp.attack.kinds", "").split(",")
    if last and all(name in logged for name in CANARY_FIGURES):
        return {name: float(logged[name]) for name in CANARY_FIGURES}
    outcome = attack_run(ctx.home, run_id, ["canary"], device_name=ctx.device, seed=seed)
    if "canary" in outcome.failed:
        raise UedpError(f"{ctx.name}: the canary attack on run {run_id} failed: {outcome.failed['canary']}")
    return {name: value for name, value in outcome.metrics.items() if name.startswith("canary_")}


def measured_once(ctx: Context, run_id: str, name: str, measure: Callable[[], float]) -> float:
    """A page's own measure of a run's model (``name``, a metric), logged to the run the first time and read back
    after, so an interrupted page does not measure it again."""
    from uedp.services.tracking import RunTracker

    logged = mlflow_client(ctx.home.root).get_run(run_id).data.metrics
    if name in logged:
        return float(logged[name])
    value = measure()
    RunTracker.attach(ctx.home, run_id).log_metrics({name: value})
    return value
