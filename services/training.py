"""Training one configuration, end to end: set up (:mod:`services.training_setup`), run
(:mod:`services.training_run`), record (:mod:`services.training_record`, MLflow as an observer of the run);
in one process, or in each torchrun process. The mechanism comes from the registry: nothing here names one.

A configuration that crashed resumes from its last checkpoint on the next call with the same
configuration: weights, generators and accountant come back, and the same MLflow run continues.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from uedp.models.device import training_precision
from uedp.models.parallel import Ranks
from uedp.services import privacy_budget
from uedp.services.audit_draw import keep_for_run
from uedp.services.config import TrainConfig
from uedp.services.lineage import keyed_table_id
from uedp.services.provenance import Provenance
from uedp.services.training_plan import TrainingPlan
from uedp.services.training_record import RunRecorder, resumable_run_id
from uedp.services.training_run import ProgressObserver, RunOutcome, run
from uedp.services.training_setup import loss_function, set_up
from uedp.services.tuned import apply_tuned
from uedp.storage.home import DataHome


@dataclass(frozen=True)
class TrainResult:
    run_id: str
    mechanism: str
    categories: list[str]
    epsilon: float
    delta: float
    noise_multiplier: float
    utility_metric: str  # "perplexity" (lower is better) or "error" (classification, lower is better)
    utility_valid: float
    utility_test: float
    rounds: int
    resumed_from: int = 0
    notes: str = ""
    privacy_extra: dict[str, float] = field(default_factory=dict)  # the statement's figures (local DP: kept share...)
    randomness: str = "none"  # secure, seeded, or none (no guarantee)
    caveats: tuple[str, ...] = ()  # what the epsilon does not cover, shown next to it
    public: tuple[str, ...] = ()  # what the guarantee treats as public
    label: str = ""  # the mechanism as reports show it (uedp-bounded-k4); empty: the mechanism's name
    unit: str = ""  # the privacy unit in the mechanism's words, as logged (MLflow's privacy_unit)
    audit_epsilon: float | None = None  # the one-run audit's lower bound (runs with audit canaries)
    detector_recall: str = ""  # entity-level mechanisms: the detectors' recall, in words (measured or not)
    # Classification: the test error of always answering the test split's majority class, and of a
    # uniform guess; an error rate means something only beside them.
    baselines: dict[str, float] = field(default_factory=dict)
    # A run from a model: that model's test figure before training (MLflow: {metric}_test_start); else None.
    start_test: float | None = None
    # Everything that defines the configuration but the seed (TrainConfig.settings): reports average only
    # runs that agree on all of it.
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def shown_as(self) -> str:
        return self.label or self.mechanism


def train_configuration(home: DataHome, config: TrainConfig, flow_run_id: str | None = None,
                        parent_run_id: str | None = None, progress: bool = True,
                        report_to: Callable[[str], Any] | None = None) -> TrainResult:
    """Train and evaluate one configuration; every figure goes to one MLflow run (torchrun: the main process).
    Progress goes to the terminal (``progress``), or as lines to ``report_to`` (a Prefect flow run's log)."""
    config = apply_tuned(home, config)  # a public search's values, before anything reads the configuration
    s = set_up(home, config, Ranks.current())
    plan = s.plan
    config = plan.config  # sampling=planned: the split it trains with, logged and charged as such
    say = report_to or _to_stderr
    spend = reservation(home, plan, s.provenance)
    if spend is not None:  # a run the dataset's budget does not allow is refused before its MLflow run opens
        resuming = resumable_run_id(s.checkpoint)  # already charged: its entry is not counted twice
        privacy_budget.check(home, config.dataset, replace(spend, key=f"run:{resuming}" if resuming else ""))
    recorder = RunRecorder(home, config, s, flow_run_id, parent_run_id)
    if spend is not None:
        spend = replace(spend, key=f"run:{recorder.run_id}")
        try:
            for line in privacy_budget.file(home, config.dataset, spend):
                say(line)
        except BaseException:
            recorder.finish(failed=True)
            raise
    for line in plan.said:  # read from the DP count: said once the run that releases (and charges) it is filed
        say(f"{config.run_name()}: {line}")
    if plan.noise_to_signal is not None:  # before training: a configuration that cannot learn is said up front
        say(f"{config.run_name()}: {plan.noise_to_signal.line()}")
        if plan.noise_warning is not None:
            say(f"warning: {plan.noise_warning}")
        recorder.tracker.log_params({"noise_to_signal": f"{plan.noise_to_signal.ratio:.6g}"})
    for warning in plan.warnings:
        say(f"warning: {config.run_name()}: {warning}")
    if s.threads is not None:  # what torch runs on, once per training (after the noise-to-signal, said first)
        say(f"{config.run_name()}: {s.threads.line()}")
    try:
        outcome = run(s, observers=(recorder, ProgressObserver(config, progress, report_to)))
        if spend is not None:  # trained to the end: the ledger holds what the statement reports from here on
            privacy_budget.settle(home, config.dataset, spend, outcome.statement.epsilon, outcome.statement.delta)
        record = recorder.record(outcome)
    except BaseException:
        recorder.finish(failed=True)
        raise
    recorder.finish()
    if s.audit is not None:  # filed last: a retry before this point resumes with the same canaries
        keep_for_run(home, config, recorder.run_id, s.audit, record)
    return result_of(config, recorder.run_id, outcome, plan.unit, s.recall.describe() if s.recall is not None else "")


def reservation(home: DataHome, plan: TrainingPlan, provenance: Provenance | None = None) -> privacy_budget.Charge | None:
    """What this run spends from its dataset's privacy ledger: the epsilon its plan states, before round 1.
    None for a run on a dataset declared public at ingest, and for a run on a local-DP release: the release was charged when it was drawn, and training on it is
    post-processing (so is any run on a dataset that is such a release, or on a synthetic corpus: its
    generating run was charged when it trained)."""
    config = plan.config
    provenance = provenance or Provenance.of(home, config)
    if not provenance.charged:
        return None  # ... and a dataset declared public at ingest: no one in it to protect (services.public_datasets)
    # In words, for the ledger's table: an entity-level run's categories and the entities table it trained
    # with (the keyed id MLflow's uedp.entities_id tag shows). Totals compose across both (privacy_budget).
    entity_level = config.is_private and config.spec.uses_categories(config.params)
    scope = (f"categories {','.join(config.categories)}; entities {keyed_table_id(home, config.dataset, 'entities')[:12]}"
             if entity_level else "")
    # The unit's key from the mechanism itself: its label (a --variant appended) could extend another's name.
    unit = config.spec.privacy_unit
    return privacy_budget.Charge(key="", mechanism=config.label, unit=plan.unit, epsilon=plan.epsilon,
                                  delta=plan.delta, name=config.run_name(),
                                  randomness=config.randomness if config.is_private else "none",
                                  scope=scope, fingerprint=config.fingerprint(),
                                  text=privacy_budget.text_of(home, config.dataset),
                                  categories=tuple(config.categories) if entity_level else (),
                                  unit_key=unit.key if unit is not None else "")


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def result_of(config: TrainConfig, run_id: str, outcome: RunOutcome, unit: str, recall: str = "") -> TrainResult:
    statement = outcome.statement
    return TrainResult(
        run_id=run_id, mechanism=config.mechanism,
        categories=list(config.categories) if config.spec.uses_categories(config.params) else [],
        epsilon=statement.epsilon, delta=statement.delta, noise_multiplier=statement.noise_multiplier,
        utility_metric=outcome.metric, utility_valid=outcome.valid, utility_test=outcome.test,
        rounds=statement.rounds, resumed_from=outcome.resumed_from, notes=statement.notes,
        privacy_extra=dict(statement.extra), randomness=statement.randomness, caveats=statement.caveats,
        public=statement.public, label=config.label, unit=unit, detector_recall=recall, baselines=outcome.baselines,
        settings=config.settings(), start_test=outcome.start_test,
    )


def train_replica(home: DataHome, config: TrainConfig) -> None:
    """A torchrun process other than the main one: train its share of every round, log nothing."""
    s = set_up(home, config, Ranks.current())
    with training_precision(config.precision):  # as the main process trains (services.training_run)
        s.mechanism.train(s.model, s.data.train, loss_function(s.config), s.device, lambda report: None, s.checkpoint)
