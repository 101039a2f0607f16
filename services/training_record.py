"""Recording one training in MLflow: the observer that logs a run's rounds, and the record of its outcome
(figures, parameters, the privacy statement, the model). Everything here is a release (docs/PRIVACY.md):
counts of private data never appear, hosts are pseudonymised, the audit's coins stay in the data home.

A resumed configuration continues the MLflow run of its checkpoint (named in the checkpoint folder's
run file), so a crash and a rerun give one run, not two.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

from uedp.models.checkpoints import RESOLVED_CONFIG, content_hash
from uedp.models.parallel import Ranks
from uedp.privacy.mechanisms.base import Checkpointer, RoundReport
from uedp.services.audit_draw import Participation, participation, releasable
from uedp.services.config import TrainConfig
from uedp.services.initial_model import base_identity
from uedp.services.lineage import (
    DATASET_ID_TAG,
    ENTITIES_ID_TAG,
    START_ID_TAG,
    START_LINEAGE_TAG,
    TEXT_LINEAGE_TAG,
    RunMarker,
    keyed_table_id,
    mark_logged_model,
    run_lineage,
    start_id,
    text_lineage,
)
from uedp.services.mlflow_views import TableInput, log_model_entry, log_table_inputs, statement_words
from uedp.services.text_overlap import remember
from uedp.services.tracking import RunTracker
from uedp.services.training_run import Observer, RunOutcome
from uedp.services.training_setup import Setup
from uedp.storage.home import DataHome
from uedp.storage.tables import table_columns

RUN_FILE = "mlflow_run.json"


def baseline_metric(metric: str, name: str) -> str:
    """A baseline's MLflow name, beside the run's own ``{metric}_test``: ``error_test_majority_baseline``,
    ``perplexity_test_unigram_baseline``."""
    return f"{metric}_test_{name}_baseline"


def logged_baselines(metric: str, metrics: Mapping[str, float]) -> dict[str, float]:
    """The baselines a run logged for its ``metric``, by name: whichever it has (a run of an older uedp
    may have none)."""
    prefix, suffix = f"{metric}_test_", "_baseline"
    return {key.removeprefix(prefix).removesuffix(suffix): value for key, value in sorted(metrics.items())
            if key.startswith(prefix) and key.endswith(suffix)}


class RunRecorder(Observer):
    """The MLflow run of one configuration, watching its rounds and recording its outcome."""

    def __init__(self, home: DataHome, config: TrainConfig, s: Setup, flow_run_id: str | None = None,
                 parent_run_id: str | None = None):
        self.home, self.config, self.s = home, config, s
        self.tracker, self.reopened = _open_tracker(home, config, _tags(home, config, s, flow_run_id, parent_run_id),
                                                   s.checkpoint)
        # Rounds between the last checkpoint and a crash run again after a resume; MLflow has their points.
        # epsilon at the schedule's shown rounds (the same on every run); train_loss every round of a noiseless one
        self.logged_until = (max(self.tracker.last_step("epsilon"), self.tracker.last_step("train_loss"))
                             if self.reopened else -1)

    @property
    def run_id(self) -> str:
        return self.tracker.run_id

    def started(self, initial_valid: Callable[[], float]) -> None:
        if self.reopened:
            return
        config, s = self.config, self.s
        # No count of the private data (users, sentences, entities): PRIVACY.md rule 4. The class label
        # set of a classifier is treated as public (the task defines it) and the statement says so.
        self.tracker.log_params(
            config.flat()
            | {"beta": config.params.clip_bound or "none", "classes": ",".join(s.data.classes or []),
               "privacy_unit": s.plan.unit,
               "model_parameters": sum(p.numel() for p in s.model.parameters()),
               "trainable_parameters": sum(p.numel() for p in s.model.parameters() if p.requires_grad)})
        log_table_inputs(self.tracker, run_tables(self.home, config, s))
        self.tracker.log_metrics({f"{config.utility_metric}_valid": initial_valid()}, step=0)

    def on_round(self, report: RoundReport) -> None:
        """The round's figures; epsilon only at the rounds whose exact figure the schedule shows, so the
        MLflow curve holds exact points only (none above the run's final epsilon)."""
        if report.round > self.logged_until:
            self.tracker.log_metrics({"train_loss": report.loss}
                                     | ({"epsilon": report.epsilon} if report.epsilon is not None else {})
                                     | ({"participants": report.participants} if report.participants is not None
                                        else {}), step=report.round)

    def record(self, outcome: RunOutcome) -> Participation | None:
        """Log the outcome; return the audit's participation record (filed with its coins by the caller)."""
        config, s, tracker, statement, metric = self.config, self.s, self.tracker, outcome.statement, outcome.metric
        if s.release is not None:
            tracker.log_metrics(statement.extra)  # kept-token share, attack success: comparable across runs
        tracker.log_metrics({f"{metric}_valid": outcome.valid}, step=statement.rounds)
        # Scored on the test split like the test figure itself (a unigram's counts: the validation split's).
        tracker.log_metrics({baseline_metric(metric, name): value for name, value in outcome.baselines.items()}
                            | ({f"{metric}_test_start": outcome.start_test} if outcome.start_test is not None else {}))
        tracker.log_metrics({metric: outcome.test, f"{metric}_test": outcome.test, "final_epsilon": statement.epsilon}
                            | ({"detector_recall": s.recall.value} if s.recall and s.recall.value is not None else {})
                            | {name: value for name, value in (("bits_per_byte_test", outcome.bits_per_byte_test),
                                                               ("bits_per_byte_test_start",
                                                                outcome.bits_per_byte_test_start),
                                                               ("bytes_scored_test", outcome.bytes_scored_test))
                               if value is not None})
        words = statement_words(statement)
        tracker.log_params({"noise_multiplier_used": statement.noise_multiplier, "accountant_used": statement.accountant,
                            "epsilon_reported": words["epsilon"],
                            "rounds_run": statement.rounds, "resumed_from_round": outcome.resumed_from,
                            "processes": Ranks.current().world, "privacy_randomness": statement.randomness,
                            "privacy_public": words["public"], "privacy_caveats": words["caveats"],
                            "privacy_statement": "docs/PRIVACY.md",
                            **({"privacy_detector_recall": s.recall.describe()} if s.recall is not None else {}),
                            **{f"privacy_{k}": v for k, v in statement.extra.items()}})
        tracker.log_json({"config": config.model_dump(), "privacy": asdict(statement)}, RESOLVED_CONFIG)
        if outcome.curve:
            rounds, epsilons = zip(*outcome.curve)
            tracker.log_curve_plot(list(rounds), list(epsilons), "epsilon_per_round.png", "round", "epsilon",
                                   f"{config.mechanism}: epsilon (delta={statement.delta:g}, {statement.accountant})")
        if s.data.canaries:  # made-up secrets, not entity text: the attack needs them to rank candidates
            # The host is named by a pseudonym keyed with the data home's secret, never by its raw user id.
            tracker.log_json([c.with_host("user-" + self.home.keyed_id(f"user:{c.user}")).as_dict()
                              for c in s.data.canaries], "canaries.json")
        record = self._audit_record(outcome) if s.audit is not None else None
        if config.log_model or s.data.canaries or s.audit is not None:
            tracker.log_model(s.model, s.tokenizer, base_identity(config, s.start) if s.start else None, self._mark)
            log_model_entry(tracker, config.run_name(), statement,
                            {"dataset": config.dataset, "mechanism": config.mechanism, "model": config.model},
                            statement.rounds)
        return record

    def _mark(self, folder: Path) -> None:
        """The logged model says which run made it and every text its weights saw (services.lineage)."""
        trained_on = self.s.release.dataset if self.s.release is not None else self.config.dataset
        lineage = run_lineage(self.home, trained_on, self.s.start.lineage if self.s.start else ())
        remember(self.home, trained_on)  # its sentences, kept while the home lives (services.text_overlap)
        mark_logged_model(self.home, folder, RunMarker(self.run_id, self.config.dataset, self.config.mechanism, lineage),
                          content_hash(folder), self.s.start.vocabulary.marker() if self.s.start else None)

    def _audit_record(self, outcome: RunOutcome) -> Participation | None:
        """Release the audit canaries' design without the coins and without real hosts, and the hosts'
        participation figures where every host is made up; return the record (filed with the coins)."""
        plan, rounds_run = self.s.audit, outcome.statement.rounds
        assert plan is not None
        # A resumed secure run drew a new root: only the rounds since the resume have known coins (none
        # when it resumed after its last round).
        first = 1 if self.config.randomness != "secure" or not self.reopened else \
            (outcome.resumed_from + 1 if outcome.resumed_from else rounds_run + 1)
        self.tracker.log_json(plan.public(), "audit_canaries.json")
        record = participation(outcome.sampling, plan, range(first, rounds_run + 1))
        if record is not None and releasable(plan):
            self.tracker.log_metrics(record.figures())
        return record

    def finish(self, failed: bool = False) -> None:
        """Close the MLflow run; a finished run is not resumed, so its checkpoint and run file go."""
        self.tracker.finish(failed=failed)
        if not failed:
            self.s.checkpoint.clear()
            _forget_run_file(self.s.checkpoint)


def run_tables(home: DataHome, config: TrainConfig, s: Setup) -> list[TableInput]:
    """The Parquet tables a run reads: the sentences it trains on (a local-DP release's, whose source's
    sentences then serve its evaluation) and, for a mechanism that protects entities, the entities table."""
    def table(dataset: str, name: str, context: str) -> TableInput:
        folder = home.table_dir(dataset, name)
        return TableInput(dataset, name, folder, keyed_table_id(home, dataset, name), tuple(table_columns(folder)),
                          context)

    if s.release is not None:
        tables = [table(s.release.dataset, "sentences", "training"), table(config.dataset, "sentences", "evaluation")]
    else:
        tables = [table(config.dataset, "sentences", "training")]
    if config.spec.uses_categories(config.params):
        tables.append(table(config.dataset, "entities", "training"))
    return tables


def _tags(home: DataHome, config: TrainConfig, s: Setup, flow_run_id: str | None,
          parent_run_id: str | None) -> dict[str, str]:
    tags = {
        "uedp.dataset": config.dataset, "uedp.mechanism": config.mechanism, "uedp.model": config.model,
        DATASET_ID_TAG: keyed_table_id(home, config.dataset, "sentences"),
        # the texts this run trains on, by keyed content id (services.lineage; a run on a local-DP release:
        # the release's text and the text it was drawn from)
        TEXT_LINEAGE_TAG: ",".join(text_lineage(home, s.release.dataset if s.release is not None else config.dataset)),
        ENTITIES_ID_TAG: keyed_table_id(home, config.dataset, "entities"),
        "uedp.device": str(s.device), "uedp.config_fingerprint": config.fingerprint(),
        "uedp.randomness": config.randomness if config.is_private else "none",
    }
    tags[START_ID_TAG] = start_id(home, s.start.content_hash if s.start is not None else "")
    if s.start is not None and s.start.lineage:  # what its start had seen: a start from this run's model inherits it
        tags[START_LINEAGE_TAG] = ",".join(s.start.lineage)
    if config.is_private and config.randomness == "seeded":
        tags["uedp.guarantee"] = "void against anyone who knows the seed (seeded randomness)"
    if flow_run_id:
        tags["uedp.flow_run_id"] = flow_run_id
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id  # MLflow's own tag: the UI nests this run under the sweep
    return tags


def resumable_run_id(checkpoint: Checkpointer) -> str | None:
    """The MLflow run a checkpoint being resumed continues, or None (a new run)."""
    if checkpoint.folder is None or checkpoint.saved_scope() is None:
        return None
    run_file = checkpoint.folder / RUN_FILE
    return str(json.loads(run_file.read_text(encoding="utf-8"))["run_id"]) if run_file.is_file() else None


def _open_tracker(home: DataHome, config: TrainConfig, tags: dict[str, str],
                  checkpoint: Checkpointer) -> tuple[RunTracker, bool]:
    """The MLflow run of a checkpoint being resumed, or a new run."""
    assert checkpoint.folder is not None
    run_file = checkpoint.folder / RUN_FILE
    if (run_id := resumable_run_id(checkpoint)) is not None:
        return RunTracker.attach(home, run_id, reopen=True), True
    tracker = RunTracker(home, config.dataset, config.run_name(), tags)
    if checkpoint.enabled:
        checkpoint.folder.mkdir(parents=True, exist_ok=True)
        run_file.write_text(json.dumps({"run_id": tracker.run_id}), encoding="utf-8")
    return tracker, False


def _forget_run_file(checkpoint: Checkpointer) -> None:
    """A finished run is not resumed: drop its run file and the checkpoint folder once it is empty."""
    if checkpoint.folder is None or not checkpoint.writes:
        return
    (checkpoint.folder / RUN_FILE).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: something else lives there; leave it
        checkpoint.folder.rmdir()

