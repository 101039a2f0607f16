"""One training configuration, end to end (data for the chosen categories, model, mechanism, per-round
epsilon, evaluation, checkpoints), tracked as one MLflow run; in one process, or in each torchrun process.
The mechanism comes from the registry: nothing here names one.

A configuration that crashed resumes from its last checkpoint on the next call with the same
configuration: weights, generators and accountant come back, and the same MLflow run continues.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from uedp.detection.identity import IDENTITY_VERSION
from uedp.errors import UedpError
from uedp.models.batching import Example
from uedp.models.device import resolve_device
from uedp.models.factory import build_model
from uedp.models.metrics import baseline_errors, causal_lm_loss, classification_error, classification_loss, perplexity
from uedp.models.parallel import Ranks
from uedp.models.threads import use_threads
from uedp.models.tokenization import load_tokenizer
from uedp.privacy.attacks.audit_canaries import AuditPlan
from uedp.privacy.mechanisms.base import Checkpointer, LossFn, Mechanism, RoundReport
from uedp.privacy.mechanisms.registry import BuildContext
from uedp.privacy.population import Population, exact_count
from uedp.privacy.randomness import Randomness
from uedp.privacy.sanitization.release import trained_on_release
from uedp.progress import progress as progress_bar
from uedp.storage.catalog import Catalog
from uedp.storage.home import DataHome
from uedp.storage.tables import read_manifest
from uedp.tasks.audit_plan import Participation, absent_units, keep_for_run, participation, plan_for, releasable
from uedp.tasks.config import SanitizeConfig, TrainConfig
from uedp.tasks.coverage import DetectorRecall, detector_recall
from uedp.tasks.sanitize import SanitizeResult, sanitize_dataset
from uedp.tasks.tracking import RunTracker
from uedp.tasks.training_data import PreparedData, prepare_data

RUN_FILE = "mlflow_run.json"


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
    audit_epsilon: float | None = None  # the one-run audit's lower bound (runs with audit canaries)
    detector_recall: str = ""  # entity-level mechanisms: the detectors' recall, in words (measured or not)
    # Classification: the test error of always answering the test split's majority class, and of a
    # uniform guess; an error rate means something only beside them.
    baselines: dict[str, float] = field(default_factory=dict)

    @property
    def shown_as(self) -> str:
        return self.label or self.mechanism


def loss_function(config: TrainConfig) -> LossFn:
    """The training objective; DP-SGD clips per example, so its loss must be a mean of per-example losses."""
    return config.spec.loss(config.task == "classification")


def build_mechanism(config: TrainConfig, population: Population | None, n_examples: int,
                    randomness: Randomness | None = None) -> Mechanism:
    """The mechanism a configuration names, from the registry. ``population`` is the public or DP count of
    the mechanism's units (sequences, users, writers), which sets sampling rates, denominators and uedp's
    bound on sampled users; ``n_examples`` is used only where neighbours have the same count (selective)."""
    randomness = randomness or Randomness.for_mode(config.randomness, config.seed)
    public_loss = classification_loss if config.task == "classification" else causal_lm_loss
    context = BuildContext(config.shape, randomness, population, n_examples, public_loss)
    try:
        return config.spec.build(config.params, context)
    except ValueError as exc:
        raise UedpError(f"{config.mechanism}: {exc}") from None


def planned_population(config: TrainConfig) -> Population | None:
    """Before any data is read (to check a target epsilon early): the declared count, or a DP count whose
    value is not known yet (its privacy cost is)."""
    if config.spec.counts is None:
        return None
    if config.public_count is not None:
        return Population.declared(config.public_count)
    return Population(1.0, "dp-count", config.count_noise)


def unit_population(config: TrainConfig, exact: int, randomness: Randomness, checkpoint: Checkpointer,
                    dataset_id: str, ceiling: int | None = None) -> Population | None:
    """The count of privacy units the mechanism may use (PRIVACY.md rule 4): declared public, or ``exact``
    plus Gaussian noise, drawn once per run (a resumed run on the same data reuses what it released).

    A declared count must be at least the true one: uedp bounds its sampled users from it, and a bound
    below the truth would undercount epsilon. The error does not print the true count. ``ceiling`` (at
    least ``exact``) is what the declared count is checked against, when that must not depend on secrets."""
    counts = config.spec.counts
    if counts is None:
        return None
    if config.public_count is not None:
        if config.public_count < max(exact, ceiling or 0):
            raise UedpError(f"--public-count {config.public_count} is below the number of privacy units of "
                            f"{config.dataset!r} ({counts}); declare the true count or an upper bound, or leave it "
                            "out for a DP count")
        return Population.declared(config.public_count)
    value = checkpoint.released(f"dp_count_of_units/{dataset_id}",
                                lambda: Population.dp_count(exact, config.count_noise, randomness).value)
    return Population(value, "dp-count", config.count_noise)


def evaluate(model: torch.nn.Module, examples: Sequence[Example], config: TrainConfig, pad_id: int,
             device: torch.device) -> float:
    """Token-weighted perplexity (language models) or the error rate (classifiers) over a split."""
    if not examples:
        return math.nan
    if config.task == "classification":
        return classification_error(model, examples, pad_id, device)
    return perplexity(model, [e for e in examples if isinstance(e, torch.Tensor)], pad_id, device)


def baselines_on(examples: Sequence[Example], classes: list[str] | None) -> dict[str, float]:
    """Classification: the majority-class and uniform-guess test errors (empty for language models)."""
    labels = [int(e[1]) for e in examples if isinstance(e, tuple)]
    return baseline_errors(labels, len(classes)) if classes and labels else {}


def keyed_table_id(home: DataHome, dataset: str, table: str) -> str:
    """A table's content key, keyed with the data home's secret: released as-is, a content key hashes the
    corpus itself and would let anyone who can guess D or D' tell them apart."""
    return home.keyed_id(str((read_manifest(home.table_dir(dataset, table)) or {}).get("key", "")))


def _tags(home: DataHome, config: TrainConfig, device: torch.device, flow_run_id: str | None,
          parent_run_id: str | None) -> dict[str, str]:
    tags = {
        "uedp.dataset": config.dataset, "uedp.mechanism": config.mechanism, "uedp.model": config.model,
        "uedp.dataset_id": keyed_table_id(home, config.dataset, "sentences"),
        "uedp.entities_id": keyed_table_id(home, config.dataset, "entities"),
        "uedp.device": str(device), "uedp.config_fingerprint": config.fingerprint(),
        "uedp.randomness": config.randomness if config.is_private else "none",
    }
    if config.is_private and config.randomness == "seeded":
        tags["uedp.guarantee"] = "void against anyone who knows the seed (seeded randomness)"
    if flow_run_id:
        tags["uedp.flow_run_id"] = flow_run_id
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id  # MLflow's own tag: the UI nests this run under the sweep
    return tags


def _open_tracker(home: DataHome, config: TrainConfig, tags: dict[str, str],
                  checkpoint: Checkpointer) -> tuple[RunTracker, bool]:
    """The MLflow run of a checkpoint being resumed, or a new run."""
    assert checkpoint.folder is not None
    run_file = checkpoint.folder / RUN_FILE
    if checkpoint.saved_scope() is not None and run_file.is_file():
        run_id = json.loads(run_file.read_text(encoding="utf-8"))["run_id"]
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


@dataclass
class Setup:
    """Everything one configuration trains with, built the same way in every torchrun process."""

    device: torch.device
    tokenizer: Any
    data: PreparedData
    model: torch.nn.Module
    mechanism: Mechanism
    checkpoint: Checkpointer
    release: SanitizeResult | None = None  # custext/santext: the local-DP release the data comes from
    caveats: tuple[str, ...] = ()  # what the epsilon does not cover (detection, evaluation)
    audit: AuditPlan | None = None  # the one-run audit's canaries and their secret coins
    recall: DetectorRecall | None = None  # entity-level mechanisms: the detectors' recall their epsilon rests on


def set_up(home: DataHome, config: TrainConfig, ranks: Ranks) -> Setup:
    """``custext``/``santext`` read the sanitized dataset (its valid and test splits are the original ones)."""
    device = resolve_device(config.device)
    use_threads(config.threads)
    torch.manual_seed(config.seed)  # the same initial weights in every process
    tokenizer = load_tokenizer(config.tokenizer)
    release = sanitize_for(home, config) if config.spec.text == "sanitized" else None
    if release is not None and ranks.world > 1 and not release.reused:
        # run_training makes the release before torchrun starts; a rank drawing its own would train on a
        # second release (a different one: releases are secure by default), and two releases compose.
        raise RuntimeError(f"rank {ranks.rank}: the local-DP release {release.dataset} was not made before torchrun")
    checkpoint = Checkpointer(home.checkpoint_dir(config.dataset, config.fingerprint()), config.checkpoint_every,
                              config.fingerprint(), writes=ranks.is_main)
    if release is None:
        check_entity_identity(home, config.dataset)
    with Catalog(home, release.dataset if release else config.dataset) as catalog:
        audit = (plan_for(home, config, sorted({user for _, user, _ in catalog.sentences("train")}),
                          resuming=checkpoint.saved_scope() is not None) if config.audit_canaries else None)
        data = prepare_data(catalog, config, tokenizer, audit)
        recall = (detector_recall(catalog, list(config.categories))
                  if config.is_private and config.spec.missed_entities is not None else None)
        caveats = coverage_caveats(config, recall)
        exact_units = exact_count(config.spec.counts, data.train) if config.spec.counts else 0
    model = build_model(config.model, config.model_size, tokenizer,
                        len(data.classes) if data.classes else None).to(device)
    # One secret root per run; under torchrun rank 0 draws it and every rank uses it.
    randomness = Randomness.for_mode(config.randomness, config.seed).shared_across_ranks()
    # A declared count is checked against the count with every audit canary planted: whether it is
    # accepted must not depend on the secret coins.
    population = unit_population(config, exact_units, randomness, checkpoint,
                                 keyed_table_id(home, config.dataset, "sentences"),
                                 ceiling=exact_units + (absent_units(audit, config.spec.counts) if audit else 0))
    mechanism = build_mechanism(config, population, len(data.train.sequences), randomness)
    return Setup(device, tokenizer, data, model, mechanism, checkpoint, release, caveats, audit, recall)


def _log_audit_plan(home: DataHome, tracker: RunTracker, s: Setup, rounds: range) -> Participation | None:
    """Release the audit canaries' design without the coins and without real hosts, and the hosts'
    participation figures where every host is made up; return the record (filed with the coins)."""
    plan = s.audit
    assert plan is not None
    tracker.log_json(plan.public(), "audit_canaries.json")
    record = participation(s.mechanism, plan, rounds)
    if record is not None and releasable(plan):
        tracker.log_metrics(record.figures())
    return record


EVALUATION_CAVEAT = ("validation and test metrics are computed without noise on held-out users' text, which the "
                     "guarantee does not cover")


def categories_warning(home: DataHome, config: TrainConfig) -> str | None:
    """Said before training: none of the chosen categories was detected in the dataset, so a mechanism
    that protects entities of those categories finds no sensitive sentence (a typo, or the wrong detector).

    For the curator's terminal only (`uedp train`): it counts the raw data, so it never goes to a task's
    log, MLflow or any other release (docs/PRIVACY.md)."""
    if (not config.spec.uses_categories(config.params) or config.spec.text == "sanitized"
            or read_manifest(home.table_dir(config.dataset, "sentences")) is None):  # not here yet (a store)
        return None
    with Catalog(home, config.dataset) as catalog:
        if "entities" not in catalog.tables:
            return None  # training itself says what is missing
        present = catalog.entities_per_category()
    if any(present.get(category) for category in config.categories):
        return None
    held = ", ".join(f"{category} {count}" for category, count in present.items()) or "no entities at all"
    return (f"no {'/'.join(config.categories)} entity was detected in {config.dataset!r} (it holds: {held}); "
            f"{config.mechanism} will find no sensitive sentence for these categories")


def check_entity_identity(home: DataHome, dataset: str) -> None:
    """Refuse an entities table built with another definition of an entity's key: its units would not
    be the ones the documentation promises (one entity, one unit, across categories)."""
    manifest = read_manifest(home.table_dir(dataset, "entities"))
    if manifest is not None and manifest.get("entity_identity") != IDENTITY_VERSION:
        raise UedpError(f"the entities table of {dataset!r} keys entities by category and surface (an older uedp); "
                        f"run `uedp detect {dataset} ...` again with the same detectors to rebuild it")


def coverage_caveats(config: TrainConfig, recall: DetectorRecall | None) -> tuple[str, ...]:
    """What a private run's epsilon leaves out: held-out evaluation, and for entity-level mechanisms the
    entities the detector missed, with its recall (:func:`tasks.coverage.detector_recall`: measured on
    held-out gold tags, so an estimate for the training users' text, or unmeasured)."""
    if not config.is_private:
        return ()
    caveats = [EVALUATION_CAVEAT]
    if recall is not None:  # an entity-level mechanism
        missed = "entities the detector missed are not protected as entities" + str(config.spec.missed_entities)
        caveats.append(f"{missed}; {recall.describe()}" + (" (gold tags are protected too)"
                                                           if recall.how == "held-out gold" else ""))
    return tuple(caveats)


def sanitize_config(config: TrainConfig) -> SanitizeConfig:
    """The local-DP release a configuration trains on (its train split, sanitized with its parameters)."""
    settings = config.params.model_dump(include=set(SanitizeConfig.model_fields))
    return SanitizeConfig(**settings, dataset=config.dataset, categories=list(config.categories), seed=config.seed,
                          randomness=config.randomness)


def sanitize_for(home: DataHome, config: TrainConfig) -> SanitizeResult:
    """The local-DP release this configuration trains on: made once, reused by every later run."""
    return sanitize_dataset(home, sanitize_config(config))


def train_replica(home: DataHome, config: TrainConfig) -> None:
    """A torchrun process other than the main one: train its share of every round, log nothing."""
    s = set_up(home, config, Ranks.current())
    s.mechanism.train(s.model, s.data.train, loss_function(config), s.device, lambda report: None, s.checkpoint)


def train_configuration(home: DataHome, config: TrainConfig, flow_run_id: str | None = None,
                        parent_run_id: str | None = None, progress: bool = True,
                        report_to: Callable[[str], Any] | None = None) -> TrainResult:
    """Train and evaluate one configuration; every figure goes to one MLflow run (torchrun: the main process).
    Progress goes to the terminal (``progress``), or as lines to ``report_to`` (a Prefect flow run's log)."""
    ranks = Ranks.current()
    s = set_up(home, config, ranks)
    device, tokenizer, data, model, mechanism, checkpoint = s.device, s.tokenizer, s.data, s.model, s.mechanism, s.checkpoint
    pad_id = s.tokenizer.pad_token_id
    metric = "error" if config.task == "classification" else "perplexity"
    tracker, resumed = _open_tracker(home, config, _tags(home, config, device, flow_run_id, parent_run_id), checkpoint)
    resumed_from, first_report = 0, True
    # Rounds between the last checkpoint and a crash run again after a resume; MLflow already has their points.
    logged_until = tracker.last_step("epsilon") if resumed else -1
    try:
        if not resumed:
            # No count of the private data (users, sentences, entities): PRIVACY.md rule 4. The class label
            # set of a classifier is treated as public (the task defines it) and the statement says so.
            tracker.log_params(
                config.flat()
                | {"beta": getattr(config.params, "clip", "none"), "classes": ",".join(data.classes or []),
                   "privacy_unit": config.spec.unit if s.release is not None else mechanism.unit,
                   "model_parameters": sum(p.numel() for p in model.parameters())})
            tracker.log_metrics({f"{metric}_valid": evaluate(model, data.valid, config, pad_id, device)}, step=0)
        rounds: list[int] = []
        epsilons: list[float] = []
        # Federated mechanisms count rounds, the others optimizer steps: the bar says which.
        unit = "rounds" if "rounds" in type(config.params).model_fields else "steps"
        bar = progress_bar(config.total_steps, f"train {config.run_name()}", unit, enabled=progress, say=report_to)

        def on_round(report: RoundReport) -> None:
            nonlocal resumed_from, first_report
            if first_report and report.round > 1:  # the first round after a resume
                resumed_from = report.round - 1
                bar.update(resumed_from)
            first_report = False
            if report.round > logged_until:
                tracker.log_metrics({"epsilon": report.epsilon, "train_loss": report.loss}
                                    | ({"participants": report.participants} if report.participants is not None
                                       else {}), step=report.round)
            if math.isfinite(report.epsilon):
                rounds.append(report.round)
                epsilons.append(report.epsilon)
                bar.set_postfix(epsilon=f"{report.epsilon:.3g}")
            elif math.isfinite(report.loss):
                bar.set_postfix(loss=f"{report.loss:.3f}")
            bar.update(1)

        statement = mechanism.train(model, data.train, loss_function(config), device, on_round, checkpoint)
        if s.release is not None:  # training on a local-DP release: the guarantee is the release's
            r = s.release
            statement = trained_on_release(statement, config.mechanism, r.statement, r,
                                           r.unprotected_share, r.randomness, r.caveats, r.attack_figures())
            tracker.log_metrics(statement.extra)  # kept-token share, attack success: comparable across runs
        statement = replace(statement, caveats=(*statement.caveats, *s.caveats),
                            public=(*statement.public, *(("the class label set",) if data.classes else ())))
        bar.close()
        valid = evaluate(model, data.valid, config, pad_id, device)
        test = evaluate(model, data.test, config, pad_id, device)
        tracker.log_metrics({f"{metric}_valid": valid}, step=statement.rounds)
        baselines = baselines_on(data.test, data.classes)
        if baselines:  # computed from the test split's labels, like the test error itself
            tracker.log_metrics({f"error_test_{name}_baseline": value for name, value in baselines.items()})
        tracker.log_metrics({metric: test, f"{metric}_test": test, "final_epsilon": statement.epsilon}
                            | ({"detector_recall": s.recall.value} if s.recall and s.recall.value is not None else {}))
        tracker.log_params({"noise_multiplier_used": statement.noise_multiplier, "accountant_used": statement.accountant,
                            "epsilon_reported": "inf" if math.isinf(statement.epsilon) else f"{statement.epsilon:.6g}",
                            "rounds_run": statement.rounds, "resumed_from_round": resumed_from,
                            "processes": ranks.world, "privacy_randomness": statement.randomness,
                            "privacy_public": " | ".join(statement.public) or "none",
                            "privacy_caveats": " | ".join(statement.caveats) or "none",
                            "privacy_statement": "docs/PRIVACY.md",
                            **({"privacy_detector_recall": s.recall.describe()} if s.recall is not None else {}),
                            **{f"privacy_{k}": v for k, v in statement.extra.items()}})
        tracker.log_json({"config": config.model_dump(), "privacy": asdict(statement)}, "resolved_config.json")
        if epsilons:
            tracker.log_curve_plot(rounds, epsilons, "epsilon_per_round.png", "round", "epsilon",
                                   f"{config.mechanism}: epsilon (delta={statement.delta:g}, {statement.accountant})")
        if data.canaries:  # made-up secrets, not entity text: the attack needs them to rank candidates
            # The host is named by a pseudonym keyed with the data home's secret, never by its raw user id.
            tracker.log_json([c.with_host("user-" + home.keyed_id(f"user:{c.user}")).as_dict() for c in data.canaries],
                             "canaries.json")
        record = None
        if s.audit is not None:
            # A resumed secure run drew a new root: only the rounds since the resume have known coins (none
            # when it resumed after its last round).
            first = 1 if config.randomness != "secure" or not resumed else \
                (resumed_from + 1 if resumed_from else statement.rounds + 1)
            record = _log_audit_plan(home, tracker, s, range(first, statement.rounds + 1))
        if config.log_model or data.canaries or s.audit is not None:
            tracker.log_model(model, tokenizer)
    except BaseException:
        tracker.finish(failed=True)
        raise
    tracker.finish()
    checkpoint.clear()
    _forget_run_file(checkpoint)
    if s.audit is not None:  # filed last: a retry before this point resumes with the same canaries
        keep_for_run(home, config, tracker.run_id, s.audit, record)
    return TrainResult(
        run_id=tracker.run_id, mechanism=config.mechanism,
        categories=list(config.categories) if config.spec.uses_categories(config.params) else [],
        epsilon=statement.epsilon, delta=statement.delta, noise_multiplier=statement.noise_multiplier,
        utility_metric=metric, utility_valid=valid, utility_test=test, rounds=statement.rounds,
        resumed_from=resumed_from, notes=statement.notes, privacy_extra=dict(statement.extra),
        randomness=statement.randomness, caveats=statement.caveats, public=statement.public,
        label=config.label, detector_recall=s.recall.describe() if s.recall is not None else "",
        baselines=baselines,
    )
