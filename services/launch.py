"""Where one configuration trains: in this process or under torchrun, its tables pulled from a table store
first (this worker may be another machine), its local-DP release drawn once for every rank and machine,
and its one-run audit scored right after. Also the checks a flow or the CLI makes before any work starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from uedp.errors import UedpError
from uedp.services.attack import attack_run
from uedp.services.config import SweepConfig, SweepItem, TrainConfig
from uedp.services.torchrun import train_with_torchrun
from uedp.services.training import TrainResult, train_configuration
from uedp.services.training_setup import build_mechanism, planned_population, sanitize_config, sanitize_for
from uedp.storage.catalog import require_ingested
from uedp.storage.home import DataHome
from uedp.storage.remote import TableStore, open_store


def preflight_sweep(home: DataHome, config: SweepConfig) -> list[SweepItem]:
    """What a sweep checks before any work starts, in one place for the CLI (before it starts a Prefect
    server) and the flow (a run from the UI): the dataset is ingested (unless a table store supplies it),
    the grid plans, and every early-calibrated target epsilon and the device are reachable."""
    if not config.store:  # with a table store each training pulls the tables first
        require_ingested(home, config.dataset)
    items = config.plan()
    check_before_training([item.config for item in items], config.run.device)
    return items


def check_before_training(configs: list[TrainConfig], device: str) -> None:
    """Fail on bad settings before any work starts: the device, and the calibration of each target epsilon
    where it does not depend on the data (mechanisms that count no units of their own): a target that is
    out of reach is a configuration error found in seconds, not after the sweep's other trainings."""
    from uedp.models.device import resolve_device

    resolve_device(device)
    for config in configs:
        if config.spec.private and config.params.budget is not None and config.spec.early_calibration:
            build_mechanism(config, planned_population(config), n_examples=0)


def run_training(home: DataHome, config: TrainConfig, flow_run_id: str | None = None,
                 parent_run_id: str | None = None, store_url: str | None = None,
                 report_to: Callable[[str], Any] | None = None) -> TrainResult:
    """Train one configuration: in this process, or under ``torchrun`` when it asks for several processes;
    with a table store, the dataset's tables come from there first (this worker may be another machine)."""
    store = open_store(store_url)
    if store:
        store.pull_required(home, config.dataset, ("sentences", "users"))
        store.pull(home, config.dataset, "entities")
    if config.spec.text == "sanitized" and (store or config.processes > 1):
        # drawn once, here: every rank and every machine then reuses this release (in one process
        # without a store, the training draws or reuses it itself)
        share_release(home, config, store)
    if config.processes > 1:
        return train_with_torchrun(home, config, flow_run_id, parent_run_id)
    result = train_configuration(home, config, flow_run_id, parent_run_id, report_to=report_to)
    return with_audit(home, config, result) if config.audit_canaries else result


def share_release(home: DataHome, config: TrainConfig, store: TableStore | None) -> None:
    """The local-DP release this configuration trains on, drawn once across machines: with a table store,
    the store's release if it has one (pulled), else one drawn here and pushed, so a training on another
    machine reuses it instead of drawing its own (two draws of the same text would compose). Two machines
    that draw the same release at the same moment still draw twice: sanitize first (`uedp sanitize`, or
    one training) where trainings of a release run side by side."""
    name = sanitize_config(config).output_name
    if store:
        for table in RELEASE_TABLES:
            store.pull(home, name, table)
    release = sanitize_for(home, config)
    if store and not release.reused:
        for table in RELEASE_TABLES:
            store.push(home, name, table)  # data and manifest only: the draws stay in this home


RELEASE_TABLES = ("sentences", "users", "entities")


def with_audit(home: DataHome, config: TrainConfig, result: TrainResult) -> TrainResult:
    """Score the run's audit canaries right away (``uedp attack --kind audit``, logged to the run), so the
    bound sits next to the accounted epsilon wherever the result is shown.

    The run stands if the audit fails, whatever the error: this runs inside the retried train task, and a
    retry after a finished run would train (and release) a second model of the same data."""
    try:
        outcome = attack_run(home, result.run_id, ["audit"], device_name=config.device)
        failure = outcome.failed.get("audit")
    except Exception as exc:  # see above: never let it reach the retry
        failure = str(exc) if isinstance(exc, UedpError) else f"{type(exc).__name__}: {exc}"
    if failure is not None:
        return replace(result, notes="; ".join(filter(None, [result.notes, f"audit failed: {failure}"])))
    return replace(result, audit_epsilon=outcome.metrics.get("audit_one_run_epsilon_lower_bound"))
