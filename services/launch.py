"""Where one configuration trains: in this process or under torchrun, its tables pulled from a table store
first (this worker may be another machine), its local-DP release drawn once for every rank and machine
(:mod:`services.training_inputs`),
and its one-run audit scored right after. Also the checks a flow or the CLI makes before any work starts.

:func:`run_training` is the one way into training for every caller (the CLI, the train task, ``uedp tune``'s
trials, ``uedp pretrain``, the synthetic measures); only it and a torchrun rank's worker call
:func:`services.training.train_configuration` (``tests/test_architecture.py`` checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from uedp.errors import UedpError
from uedp.services.attack import attack_run
from uedp.services.config import TrainConfig
from uedp.services.sweep_config import SweepConfig, SweepItem
from uedp.services.torchrun import train_with_torchrun
from uedp.services.training import TrainResult, train_configuration
from uedp.services.training_inputs import draw_inputs
from uedp.services.training_plan import preflight_plan, preflight_skipped
from uedp.storage.catalog import require_tables
from uedp.storage.home import DataHome
from uedp.storage.remote import open_store


def preflight_sweep(home: DataHome, config: SweepConfig, say: Callable[[str], Any] | None = None) -> list[SweepItem]:
    """What a sweep checks before any work starts, in one place for the CLI (before it starts a Prefect
    server) and the flow (a run from the UI): the dataset is ingested (unless a table store supplies it),
    the grid plans, and every early-calibrated target epsilon and the device are reachable. ``say`` hears
    what the pre-flight could not plan yet (:func:`check_before_training`)."""
    require_tables(home, config.dataset, config.store)
    items = config.items()
    for line in check_before_training([item.config for item in items], config.run.device):
        if say is not None:
            say(line)
    return items


def check_before_training(configs: list[TrainConfig], device: str) -> list[str]:
    """Fail on bad settings before any work starts: the device, and the calibration of each target epsilon
    where it does not depend on the data (mechanisms that count no units of their own): a target that is
    out of reach is a configuration error found in seconds, not after the sweep's other trainings. Returns
    what it could not plan before the data is read, in words (``sampling=planned`` from a count not known
    yet: training plans and checks it), once per configuration."""
    from uedp.models.device import resolve_device

    resolve_device(device)
    skipped: list[str] = []
    for config in configs:
        if config.spec.private and config.params.budget is not None and config.spec.early_calibration:
            reason = preflight_skipped(config)
            if reason is None:
                preflight_plan(config)
            elif reason not in skipped:
                skipped.append(reason)
    return skipped


def run_training(home: DataHome, config: TrainConfig, flow_run_id: str | None = None,
                 parent_run_id: str | None = None, store_url: str | None = None,
                 report_to: Callable[[str], Any] | None = None, progress: bool = True) -> TrainResult:
    """Train one configuration: in this process, or under ``torchrun`` when it asks for several processes;
    with a table store, the dataset's tables come from there first (this worker may be another machine).
    Progress goes to the terminal (``progress``), or as lines to ``report_to`` (a Prefect flow run's log)."""
    store = open_store(store_url)
    if store:
        store.pull_required(home, config.dataset, ("sentences", "users"))
        store.pull(home, config.dataset, "entities")
    draw_inputs(home, config, store)  # a local-DP release, drawn here once: every process opens it by name
    if config.processes > 1:
        return train_with_torchrun(home, config, flow_run_id, parent_run_id)
    result = train_configuration(home, config, flow_run_id, parent_run_id, progress=progress, report_to=report_to)
    return with_audit(home, config, result) if config.audit_canaries else result


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
