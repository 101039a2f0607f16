"""Set-up of one training configuration: everything it trains with (device, tokenizer, data for the chosen
categories, model, the count of its units, the audit's canaries, the caveats its epsilon carries) and its
training plan (:mod:`services.training_plan`: the mechanism, what it spends), built the same way in every
torchrun process. Set-up opens its inputs and never makes them: a local-DP release is drawn before
training (:mod:`services.training_inputs`) and opened here by name. Nothing here names a mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from uedp.detection import detectors as detector_registry
from uedp.detection.categories import taxonomy
from uedp.detection.identity import IDENTITY_VERSION
from uedp.errors import UedpError
from uedp.models.device import resolve_device
from uedp.models.lora import trainable_count
from uedp.models.parallel import Ranks
from uedp.models.threads import ThreadChoice, apply_threads, choose_threads
from uedp.models.tokenization import load_tokenizer
from uedp.privacy.attacks.audit_canaries import AuditDraw
from uedp.privacy.mechanisms.base import Checkpointer, LossFn, Mechanism
from uedp.privacy.population import Population, exact_count
from uedp.privacy.randomness import Randomness
from uedp.services.audit_draw import absent_units, draw_for
from uedp.services.config import TrainConfig
from uedp.services.coverage import DetectorRecall, detector_recall
from uedp.services.initial_model import Start, resolve_start, start_model
from uedp.services.lineage import keyed_table_id
from uedp.services.ner import refuse_ner_fitted_to_training_text
from uedp.services.provenance import Provenance
from uedp.services.public_datasets import declared_public_words
from uedp.services.releases import SanitizeResult
from uedp.services.training_data import PreparedData, prepare_data
from uedp.services.training_plan import PublicFacts, TrainingPlan, plan_training
from uedp.services.tuned import tuned_public
from uedp.storage.catalog import Catalog
from uedp.storage.formats.registry import user_fix
from uedp.storage.home import DataHome
from uedp.storage.manifests import entities_manifest, sentences_manifest


def loss_function(config: TrainConfig) -> LossFn:
    """The training objective; DP-SGD clips per example, so its loss must be a mean of per-example losses."""
    return config.spec.loss(config.task == "classification")


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


@dataclass
class Setup:
    """Everything one configuration trains with, built the same way in every torchrun process."""

    device: torch.device
    tokenizer: Any
    data: PreparedData
    model: torch.nn.Module
    plan: TrainingPlan  # the mechanism, the configuration as it trains, unit, epsilon: fixed before round 1
    checkpoint: Checkpointer
    provenance: Provenance | None = None  # where the text comes from (a release, a synthetic corpus...)
    caveats: tuple[str, ...] = ()  # what the epsilon does not cover (detection, evaluation)
    audit: AuditDraw | None = None  # the one-run audit's canaries and their secret coins
    recall: DetectorRecall | None = None  # entity-level mechanisms: the detectors' recall their epsilon rests on
    start: Start | None = None  # where the weights came from (the statement names it public; LoRA's base)
    threads: ThreadChoice | None = None  # torch's intra-op threads and why (said before training)
    public: tuple[str, ...] = ()  # what else the statement treats as public (a search's hyperparameters)
    scores_dir: Path | None = None  # where a start's held-out figures are remembered (services/start_scores.py)

    @property
    def release(self) -> SanitizeResult | None:
        """custext/santext: the local-DP release the train split comes from."""
        return self.provenance.release if self.provenance is not None else None

    @property
    def mechanism(self) -> Mechanism:
        return self.plan.mechanism

    @property
    def config(self) -> TrainConfig:
        """The configuration as it trains (sampling=planned: with the planner's q_user and rounds)."""
        return self.plan.config


def set_up(home: DataHome, config: TrainConfig, ranks: Ranks) -> Setup:
    """Open everything a configuration trains with and plan it. ``custext``/``santext`` read their local-DP
    release (its valid and test splits are the original ones), opened by name: drawn before training by
    :mod:`services.training_inputs`, never here."""
    device = resolve_device(config.device)
    threads = apply_threads(choose_threads(config.threads))
    torch.manual_seed(config.seed)  # the same initial weights in every process
    start = resolve_start(home, config)
    tokenizer = load_tokenizer(start.tokenizer)
    provenance = Provenance.of(home, config)  # read once: what the text is decides the rest
    provenance.refuse(config)
    release = provenance.release
    # A checkpoint holds only what trains (LoRA's adapters): resuming on a base whose files changed is refused.
    checkpoint = Checkpointer(home.checkpoint_dir(config.dataset, config.fingerprint()), config.checkpoint_every,
                              config.fingerprint() + (f"+{start.content_hash}" if start.content_hash else ""),
                              writes=ranks.is_main)
    if release is None:
        check_entity_identity(home, config.dataset)
        check_labels_unchanged(home, config)
        check_detection_independent(home, config)
    with Catalog(home, provenance.training_dataset) as catalog:
        audit = (draw_for(home, config, sorted({user for _, user, _ in catalog.sentences("train")}),
                          resuming=checkpoint.saved_scope() is not None) if config.audit_canaries else None)
        data = prepare_data(catalog, config, tokenizer, audit)
        check_trainable(home, config, data)
        recall = (detector_recall(catalog, list(config.categories))
                  if config.is_private and config.spec.missed_entities is not None else None)
        caveats = coverage_caveats(config, recall)
        exact_units = exact_count(config.spec.counts, data.train) if config.spec.counts else 0
    model = start_model(config, start, tokenizer, len(data.classes) if data.classes else None).to(device)
    # One secret root per run; under torchrun rank 0 draws it and every rank uses it.
    randomness = Randomness.for_mode(config.randomness, config.seed).shared_across_ranks()
    # A declared count is checked against the count with every audit canary planted: whether it is
    # accepted must not depend on the secret coins.
    population = unit_population(config, exact_units, randomness, checkpoint,
                                 keyed_table_id(home, config.dataset, "sentences"),
                                 ceiling=exact_units + (absent_units(audit, config.spec.counts) if audit else 0))
    # The checkpoint was named by the configuration as given: a resume plans the same split from the same count.
    facts = PublicFacts(population, n_examples=len(data.train.sequences), train_users=data.train.n_users,
                        entities=data.train.entities,
                        more_users=user_fix(dataset_format(home, config.dataset)),
                        trainable=trainable_count(model))
    plan = provenance.planned(plan_training(config, facts, randomness))
    return Setup(device, tokenizer, data, model, plan, checkpoint, provenance, caveats, audit, recall, start, threads,
                 (*tuned_public(home, config), *declared_public_words(home, config.dataset)),
                 home.cache_dir("start-scores"))


def check_trainable(home: DataHome, config: TrainConfig, data: PreparedData) -> None:
    """Stop, before anything is drawn, filed or trained, a run that could not be evaluated or that its
    mechanism cannot train: one line saying why and what fixes it.

    Whether a configuration is refused here depends on the data (whether the test split is empty, whether
    the train split has two users): one bit per refused configuration, in a task's log (docs/PRIVACY.md,
    "Failures and warnings"). The message names no count."""
    if not data.test:
        raise UedpError(f"dataset {config.dataset!r} has no test sentences{' with a class label' if data.classes else ''}: "
                        f"{config.mechanism} could not be evaluated (its test {config.utility_metric} would be nan). Give "
                        "it held-out users: ingest again with --split users (whole users to train, valid and test; a "
                        "corpus of a few users may still leave test empty) or --split-of FILE=test for a file of its own")
    if data.train.n_users < config.spec.min_train_users:
        fix = user_fix(dataset_format(home, config.dataset))
        raise UedpError(f"dataset {config.dataset!r} has fewer than {config.spec.min_train_users} users in its train "
                        f"split: {config.mechanism} protects each user's whole contribution, so with one user every "
                        f"round's update is that user's clipped change or nothing, under noise scaled to it, and there "
                        f"is nothing to learn. Train it on a corpus of many users ({fix}), or use dpsgd, whose unit is "
                        "one training sequence")


def dataset_format(home: DataHome, dataset: str) -> str:
    """The corpus format a dataset was ingested from ("" when its manifest does not say: a derived table)."""
    manifest = sentences_manifest(home, dataset)
    return manifest.source_format if manifest is not None else ""


EVALUATION_CAVEAT = ("validation and test metrics are computed without noise on held-out users' text, which the "
                     "guarantee does not cover")


def categories_warning(home: DataHome, config: TrainConfig) -> str | None:
    """Said before training: none of the chosen categories was detected in the dataset, so a mechanism
    that protects entities of those categories finds no sensitive sentence (a typo, or the wrong detector).

    For the curator's terminal only (`uedp train`): it counts the raw data, so it never goes to a task's
    log, MLflow or any other release (docs/PRIVACY.md)."""
    if (not config.spec.uses_categories(config.params) or config.spec.text == "sanitized"
            or sentences_manifest(home, config.dataset) is None):  # not here yet (a store)
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
    manifest = entities_manifest(home, dataset)
    if manifest is not None and manifest.entity_identity != IDENTITY_VERSION:
        raise UedpError(f"the entities table of {dataset!r} keys entities by category and surface (an older uedp); "
                        f"run `uedp detect {dataset} ...` again with the same detectors to rebuild it")


def check_labels_unchanged(home: DataHome, config: TrainConfig) -> None:
    """Refuse a run that chooses categories when the data home's labels (labels.yaml) changed after its
    entities were detected: its --categories would resolve with the new mapping against rows stored under
    the old one, and protect other entities than it says. Detection's cache key holds the taxonomy, so
    detecting again applies the new mapping."""
    if not config.spec.uses_categories(config.params):
        return
    manifest = entities_manifest(home, config.dataset)
    stored = manifest.taxonomy_digest if manifest is not None else None
    if stored is not None and stored != taxonomy(home.labels_file).digest:
        raise UedpError(f"the category labels of this data home ({home.labels_file}) changed since the entities of "
                        f"{config.dataset!r} were detected: {config.mechanism} would resolve its categories with the new "
                        f"mapping against entities stored under the old one. Run `uedp detect {config.dataset} ...` "
                        "again with the same detectors")


def check_detection_independent(home: DataHome, config: TrainConfig) -> None:
    """Refuse a run that chooses categories from an entities table a NER fitted to this dataset's training text
    detected (a table an older uedp made; detection refuses it now): services.ner explains why."""
    if not config.spec.uses_categories(config.params):
        return
    manifest = entities_manifest(home, config.dataset)
    if manifest is None:
        return
    specs = detector_registry.detectors()
    if any(specs[name].needs_nlp for name in manifest.detectors if name in specs):
        refuse_ner_fitted_to_training_text(home, config.dataset, manifest.spacy_model or None,
                                           f"{config.mechanism} on {config.dataset!r}")


def coverage_caveats(config: TrainConfig, recall: DetectorRecall | None) -> tuple[str, ...]:
    """What a private run's epsilon leaves out: held-out evaluation, and for entity-level mechanisms the
    entities the detector missed, with its recall (:func:`services.coverage.detector_recall`: measured on
    held-out gold tags, so an estimate for the training users' text, or unmeasured), and how many surfaces the
    curator's --ignore-entities list dropped from detection (a count of the list, never its surfaces)."""
    if not config.is_private:
        return ()
    caveats = [EVALUATION_CAVEAT]
    if recall is not None:  # an entity-level mechanism
        missed = "entities the detector missed are not protected as entities" + str(config.spec.missed_entities)
        caveats.append(f"{missed}; {recall.describe()}" + (" (gold tags are protected too)"
                                                           if recall.how == "held-out gold" else ""))
        if recall.ignored_surfaces:  # a count of the curator's list; the surfaces themselves are never released
            n = recall.ignored_surfaces
            caveats.append(f"{n} surface{'s' if n != 1 else ''} listed in --ignore-entities {'are' if n != 1 else 'is'} "
                           "not protected as entities (dropped from detection by the curator)")
    return tuple(caveats)
