"""From a dataset's tables to what a mechanism trains on: examples grouped by user, each sentence's
entity keys for the chosen categories, the redacted variant, and the evaluation splits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from uedp.errors import UedpError
from uedp.models.batching import Example, encode, encode_with_private_mask
from uedp.privacy.attacks.audit_canaries import AuditDraw
from uedp.privacy.attacks.canaries import Canary, plant_canaries
from uedp.privacy.deid import redact
from uedp.privacy.mechanisms.base import TrainData
from uedp.services.audit_draw import CANARY_CATEGORY, canary_key
from uedp.services.config import TrainConfig
from uedp.services.control_codes import code_length, with_code
from uedp.storage.catalog import Catalog


@dataclass(frozen=True)
class TrainingTexts:
    """Train-split texts by user, parallel to them each sentence's entity keys (chosen categories), the
    texts with those entities redacted, and (classification) each sentence's class."""

    texts: dict[str, list[str]]
    entities: dict[str, list[frozenset[str]]]
    redacted: dict[str, list[str]]
    labels: dict[str, list[str]] | None = None
    canaries: tuple[Canary, ...] = ()
    spans: dict[str, list[list[tuple[int, int]]]] = field(default_factory=dict)  # per sentence, its sensitive spans


def load_training_texts(catalog: Catalog, config: TrainConfig, audit: AuditDraw | None = None) -> TrainingTexts:
    """Train-split texts by user; ``deid`` trains on the redacted ones in place of the originals; with
    the one-run audit's canaries when ``audit`` is given; with control codes, each sentence after its class'
    code (its sensitive spans moved by the code's length)."""
    # A mechanism the categories do not change (noiseless) needs no entities table.
    needless = "entities" not in catalog.tables and not config.spec.uses_categories(config.params)
    spans = {} if needless else catalog.entity_spans(config.categories, "train")
    classes = catalog.labels("train") if config.task == "classification" else None
    codes = coded_labels(catalog, config, "train")
    texts: dict[str, list[str]] = {}
    entities: dict[str, list[frozenset[str]]] = {}
    redacted: dict[str, list[str]] = {}
    labels: dict[str, list[str]] = {}
    spans_of: dict[str, list[list[tuple[int, int]]]] = {}
    for sentence_id, user_id, text in catalog.sentences("train"):
        if classes is not None:
            if sentence_id not in classes:
                continue  # a classification corpus' unlabeled sentence teaches nothing
            labels.setdefault(user_id, []).append(classes[sentence_id])
        found = spans.get(sentence_id, [])
        clean = redact(text, [(s, e, c) for s, e, c, _ in found]) if found else text
        if codes is not None:
            if sentence_id not in codes:
                continue  # no class, no code: the model would learn text of no class
            shift = code_length(codes[sentence_id])
            text, clean = with_code(codes[sentence_id], text), with_code(codes[sentence_id], clean)
            found = [(s + shift, e + shift, c, k) for s, e, c, k in found]
        texts.setdefault(user_id, []).append(clean if config.spec.text == "redacted" else text)
        redacted.setdefault(user_id, []).append(clean)
        entities.setdefault(user_id, []).append(frozenset(key for _, _, _, key in found))
        spans_of.setdefault(user_id, []).append([(s, e) for s, e, _, _ in found])
    training = TrainingTexts(texts, entities, redacted, labels if classes is not None else None, spans=spans_of)
    training = with_canaries(training, config) if config.canaries else training
    return with_audit_canaries(training, config, audit) if audit is not None else training


def coded_labels(catalog: Catalog, config: TrainConfig, split: str) -> dict[int, str] | None:
    """``sentence_id -> class`` of a split, when the configuration reads sentences after their control codes
    (None when it does not); a corpus without classes is refused, naming the setting."""
    if not config.control_codes:
        return None
    labels = catalog.labels(split)
    if not labels and split == "train":
        raise UedpError(f"dataset {config.dataset!r} has no class labels in its train split: control_codes write each "
                        "sentence's class before it (ingest a labelled corpus, e.g. ag_news)")
    return labels


def with_audit_canaries(training: TrainingTexts, config: TrainConfig, plan: AuditDraw) -> TrainingTexts:
    """Add the sentences the audit's coins plant (:meth:`AuditDraw.placements`). A canary's name, when
    the plan marks it, is an entity of the run's chosen categories: detected (an entity set, a private
    span) and redacted like one."""
    texts, redacted = {u: list(v) for u, v in training.texts.items()}, {u: list(v) for u, v in training.redacted.items()}
    entities, spans = {u: list(v) for u, v in training.entities.items()}, {u: list(v) for u, v in training.spans.items()}
    for placement in plan.placements():
        text, user, span = placement.text, placement.user, placement.span
        clean = redact(text, [(span[0], span[1], CANARY_CATEGORY)]) if span else text
        texts.setdefault(user, []).append(clean if config.spec.text == "redacted" else text)
        redacted.setdefault(user, []).append(clean)
        entities.setdefault(user, []).append(frozenset({canary_key(text[span[0]:span[1]])}) if span else frozenset())
        spans.setdefault(user, []).append([span] if span else [])
    return TrainingTexts(texts, entities, redacted, training.labels, training.canaries, spans)


def with_canaries(training: TrainingTexts, config: TrainConfig) -> TrainingTexts:
    """Plant the configuration's canaries in the training text (and its redacted twin: no detector marks
    them, so to every mechanism they are ordinary sentences with no entity)."""
    try:
        texts, canaries = plant_canaries(training.texts, config.canaries, config.canary_repeats, config.canary_formats,
                                         seed=config.seed, users=config.canary_users)
    except ValueError as exc:
        raise UedpError(f"dataset {config.dataset!r}: {exc}") from None
    redacted, entities = {u: list(v) for u, v in training.redacted.items()}, {u: list(v) for u, v in training.entities.items()}
    spans = {u: list(v) for u, v in training.spans.items()}
    for canary in canaries:
        redacted[canary.user] += [canary.text] * canary.repeats
        entities[canary.user] += [frozenset()] * canary.repeats
        spans.setdefault(canary.user, []).extend([[] for _ in range(canary.repeats)])
    return TrainingTexts(texts, entities, redacted, training.labels, tuple(canaries), spans)


def class_names(labels: dict[str, list[str]]) -> list[str]:
    """The training split's classes in a stable order (numerically when they are numbers)."""
    names = {label for user_labels in labels.values() for label in user_labels}
    return sorted(names, key=lambda n: (0, int(n), n) if n.lstrip("-").isdigit() else (1, 0, n))


@dataclass(frozen=True)
class PreparedData:
    train: TrainData
    valid: list[Example]
    test: list[Example]
    classes: list[str] | None  # classification: the class names, index = class id
    canaries: tuple[Canary, ...] = ()


def prepare_data(catalog: Catalog, config: TrainConfig, tokenizer: PreTrainedTokenizerBase,
                 audit: AuditDraw | None = None) -> PreparedData:
    training = load_training_texts(catalog, config, audit)
    if not training.texts:
        raise UedpError(f"dataset {config.dataset!r} has no training sentences"
                        + (" with a class label" if config.task == "classification" else ""))
    classes = class_names(training.labels) if training.labels is not None else None
    index = {name: i for i, name in enumerate(classes or [])}

    def examples(texts: list[str], labels: list[str] | None) -> list[Example]:
        if not texts:
            return []
        ids = encode(tokenizer, texts, config.max_len)
        return list(ids) if labels is None else [(row, index[label]) for row, label in zip(ids, labels)]

    def labels_of(user: str) -> list[str] | None:
        return training.labels[user] if training.labels is not None else None

    needs = config.spec.needs(config.shape)
    redacted = ({u: examples(t, labels_of(u)) for u, t in training.redacted.items()}
                if "redacted" in needs else None)
    masks = None
    by_user: dict[str, list[Example]]
    if "private_masks" in needs:  # e.g. Selective-DPSGD: which tokens are private
        pairs = {u: encode_with_private_mask(tokenizer, t, training.spans[u], config.max_len) for u, t in training.texts.items()}
        by_user = {u: list[Example](ids) for u, (ids, _) in pairs.items()}
        masks = {u: m for u, (_, m) in pairs.items()}
    else:
        by_user = {u: examples(t, labels_of(u)) for u, t in training.texts.items()}
    entities = training.entities if "entities" in needs else None
    train = TrainData(by_user, tokenizer.pad_token_id, entities=entities, redacted=redacted,
                      private_masks=masks, max_len=config.max_len)
    return PreparedData(train, _split(catalog, config, "valid", examples, index),
                        _split(catalog, config, "test", examples, index), classes, training.canaries)


def _split(catalog: Catalog, config: TrainConfig, split: str,
           examples: Callable[[list[str], list[str] | None], list[Example]], index: dict[str, int]) -> list[Example]:
    rows = catalog.sentences(split)
    codes = coded_labels(catalog, config, split)
    if codes is not None:  # held-out text is read as training read its text: after its class' code
        return examples([with_code(codes[sid], text) for sid, _, text in rows if sid in codes], None)
    if config.task == "lm":
        return examples([text for _, _, text in rows], None)
    classes = catalog.labels(split)
    unknown = sorted({label for label in classes.values() if label not in index})
    if unknown:
        raise UedpError(f"dataset {config.dataset!r}: {split} split has classes the training split lacks: "
                        f"{', '.join(unknown)}")
    labeled = [(text, classes[sid]) for sid, _, text in rows if sid in classes]
    return examples([t for t, _ in labeled], [c for _, c in labeled])
