"""Sanitize a dataset under local DP (CusText or SanText) into a new dataset whose train split is the
users' privatized text; valid and test stay original (a model is judged on real text). The new
dataset trains noiselessly through the same sweep; its manifest carries the privacy statement.

Tokens are words (``\\w+`` runs and single punctuation marks) looked up in a vector file, or the
tokens of a pretrained tokenizer whose model's input embeddings are the vectors. A sanitized token
without an embedding is released as ``<unk>`` whatever it was.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from uedp.detection.identity import IDENTITY_VERSION
from uedp.errors import UedpError
from uedp.privacy.mechanisms import registry
from uedp.privacy.mechanisms.params import Keep
from uedp.privacy.randomness import Randomness
from uedp.privacy.sanitization.draws import DRAWS_FILE, Draws
from uedp.privacy.sanitization.embeddings import WORD, Embeddings, from_model, load_vectors
from uedp.privacy.sanitization.mechanisms import KEEP, UNKNOWN, Sampler, privatize
from uedp.privacy.sanitization.release import local_dp_kind, release_figures
from uedp.progress import progress as progress_bar
from uedp.services import privacy_budget
from uedp.services.releases import ATTACK_FIGURES, SanitizeResult, record_release
from uedp.services.sanitize_attack import attack_figures, attack_spec
from uedp.services.sanitize_config import SanitizeConfig
from uedp.storage.catalog import Catalog
from uedp.storage.home import DataHome
from uedp.storage.manifests import (
    SentencesManifest,
    entities_manifest,
    entities_manifest_in,
    sentences_manifest,
    sentences_manifest_in,
)
from uedp.storage.public_declaration import public_declaration
from uedp.storage.schemas import ENTITIES, SENTENCES, USERS
from uedp.storage.tables import TableWriter, hash_config, is_current, read_table
from uedp.storage.text_identity import TEXT_KEY, table_text_key, text_key_of

__all__ = ["SanitizeConfig", "SanitizeResult", "sanitize_dataset"]

UNKNOWN_TEXT = "<unk>"


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Segmenter:
    """Text -> token spans and vocabulary indices, and vocabulary index -> output text."""

    def __init__(self, embeddings: Embeddings, tokenizer: object | None = None):
        self.embeddings, self.tokenizer = embeddings, tokenizer

    def spans(self, text: str) -> list[tuple[int, int, int]]:
        if self.tokenizer is None:
            return [(m.start(), m.end(), _index(self.embeddings.lookup(m.group()))) for m in WORD.finditer(text)]
        encoded = self.tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)  # type: ignore[operator]
        pieces = self.tokenizer.convert_ids_to_tokens(encoded["input_ids"])  # type: ignore[attr-defined]
        return [(s, e, _index(self.embeddings.index.get(p))) for (s, e), p in zip(encoded["offset_mapping"], pieces)]

    def text_of(self, index: int) -> str:
        if index < 0:
            return UNKNOWN_TEXT
        token = self.embeddings.tokens[index]
        if self.tokenizer is None:
            return token
        return str(self.tokenizer.convert_tokens_to_string([token])).strip()  # type: ignore[attr-defined]


def _index(found: int | None) -> int:
    return UNKNOWN if found is None else found


def load_embeddings(config: SanitizeConfig) -> tuple[Embeddings, object | None]:
    if config.embeddings.startswith("model:"):
        from transformers import AutoModel, AutoTokenizer

        folder = Path(config.embeddings.removeprefix("model:")).expanduser()
        if not folder.is_dir():
            raise UedpError(f"--embeddings {config.embeddings}: {folder} is not a pretrained model folder")
        tokenizer = AutoTokenizer.from_pretrained(folder)
        return from_model(AutoModel.from_pretrained(folder), tokenizer), tokenizer
    embeddings = load_vectors(Path(config.embeddings).expanduser(), config.vocab_limit)
    return embeddings, None


def without_stopwords(embeddings: Embeddings) -> Embeddings:
    """The vocabulary minus spaCy's English stopwords: kept tokens are never inputs or outputs of the
    mechanism, so the guarantee is among sanitized (non-stopword) tokens only."""
    from spacy.lang.en.stop_words import STOP_WORDS

    keep = [i for i, t in enumerate(embeddings.tokens) if t.lower() not in STOP_WORDS]
    return Embeddings([embeddings.tokens[i] for i in keep], embeddings.vectors[keep], embeddings.source + " - stopwords")


def sanitize_dataset(home: DataHome, config: SanitizeConfig, progress: bool = False,
                     say: Callable[[str], Any] | None = None) -> SanitizeResult:
    """Write the sanitized dataset (sentences + users, atomically), unless the same one exists. A new
    release is filed in the source dataset's privacy ledger; what it had already spent goes to ``say``
    (default: stderr). Either way the release is recorded for the trainings that open it by name
    (:func:`services.releases.open_release`)."""
    source = sentences_manifest(home, config.dataset)
    if source is None:
        raise UedpError(f"dataset {config.dataset!r} has no sentences table under {home.dataset_dir(config.dataset)}; "
                        "ingest it first")
    entities_key = ""
    if config.keep == "non-entities":
        entities = entities_manifest(home, config.dataset)
        if entities is None:
            raise UedpError(f"--keep non-entities needs detected entities: run `uedp detect {config.dataset}` first")
        entities_key = entities.key
    embeddings, tokenizer = load_embeddings(config)
    if config.keep == "stopwords":
        embeddings = without_stopwords(embeddings)
    identity = {"sentences": source.key, "entities": entities_key, "embeddings": embeddings.key(),
                "config": config.release_settings()}
    key = hash_config(identity)
    # A release is drawn once and then reused, never redrawn: a second draw released next to the first
    # would compose (twice the epsilon), so one name holds one release, and another release (other
    # settings, other source text) under a name that holds one is refused rather than drawn over it.
    out_sentences = home.table_dir(config.output_name, "sentences")
    existing = sentences_manifest_in(out_sentences)
    if existing is not None and existing.key != key:
        raise UedpError(_another_release(config, existing, identity, out_sentences.parent))
    sampler, unprotected = _sampler(home, config, embeddings)
    segmenter = Segmenter(embeddings, tokenizer)
    table = read_table(home.table_dir(config.dataset, "sentences"))
    texts = table["text"].to_pylist()
    if existing is not None:
        reused = _reused(home, config, key, existing, sampler, unprotected, table, texts, segmenter)
        record_release(home, config, key, reused)
        return reused

    # A new draw is a release from the dataset's private text: filed in its privacy ledger first (refused
    # past its budget), withdrawn if the draw fails (nothing is written then). Keyed by the draw, not by
    # its settings: the same settings drawn again (under another name, or after its folder was removed)
    # is another release.
    release = privacy_budget.Charge(
        key=f"release:{config.output_name}:{uuid.uuid4().hex[:12]}", mechanism=config.mechanism, unit=registry.get(config.mechanism).unit,
        epsilon=sampler.per_token_epsilon, delta=0.0, name=config.output_name, randomness=config.randomness,
        scope=f"keep {config.keep}" + (f"; categories {','.join(config.categories)}; entities "
                                       f"{home.keyed_id(entities_key)[:12]}" if config.keep == "non-entities" else ""),
        text=privacy_budget.text_of(home, config.dataset),
        categories=tuple(config.categories) if config.keep == "non-entities" else ())
    charged = public_declaration(home, config.dataset) is None  # a dataset declared public: no ledger to charge
    if charged:
        privacy_budget.check(home, config.dataset, release)
    reservation: contextlib.AbstractContextManager[list[str]] = (
        privacy_budget.reserved(home, config.dataset, release) if charged else contextlib.nullcontext([]))
    with reservation as spent:
        for line in spent:
            (say or _to_stderr)(line)
        drawn = _draw(home, config, key, identity, source, sampler, unprotected, segmenter, table, texts, progress)
    record_release(home, config, key, drawn)  # what a training opens by name (services.releases)
    return drawn


def _draw(home: DataHome, config: SanitizeConfig, key: str, identity: dict[str, Any], source: SentencesManifest,
          sampler: Sampler, unprotected: float, segmenter: Segmenter, table: pa.Table, texts: list[str],
          progress: bool) -> SanitizeResult:
    """Draw the release and write the sanitized dataset (sentences, users, empty entities) atomically."""
    out_sentences, out_users = home.table_dir(config.output_name, "sentences"), home.table_dir(config.output_name, "users")
    train = pc.equal(table["split"], "train").to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(train)
    sensitive = _sensitive_spans(home, config) if config.keep == "non-entities" else None
    ids = table["sentence_id"].to_pylist()
    segmented, records = [], []
    bar = progress_bar(len(rows), f"segment {config.dataset}", "sentences", enabled=progress)
    for row in rows:
        bar.update(1)
        spans = segmenter.spans(texts[row])
        selected = _selector(config.keep, sensitive.get(ids[row], []) if sensitive is not None else [])
        segmented.append(spans)
        text = texts[row]
        records.append(np.array([index if selected(start, end, text[start:end]) else KEEP
                                 for start, end, index in spans], dtype=np.int64))
    bar.close()
    # A secure release's root comes from the OS and is never stored: the release is reused, never redrawn.
    randomness = Randomness.for_mode(config.randomness, config.seed)
    released = privatize(records, sampler, randomness.stream("sanitize"))
    draws = Draws(rows, [[(s, e) for s, e, _ in spans] for spans in segmented], records, released)
    new_texts = list(texts)
    for row, places, record, out in zip(rows, draws.spans, records, released):
        new_texts[row] = _rebuild(texts[row], places, record, out, segmenter)

    result = replace(_summary(config, sampler, unprotected, table, rows, records, released),
                     **attack_figures(home, config, key, None, draws, texts, segmenter.text_of))
    sanitized = table.set_column(table.schema.get_field_index("text"), "text", pa.array(new_texts, pa.string()))
    spans_column = pa.array([[] if is_train else s for is_train, s in zip(train, table["gold_spans"].to_pylist())],
                            SENTENCES.field("gold_spans").type)
    sanitized = sanitized.set_column(sanitized.schema.get_field_index("gold_spans"), "gold_spans", spans_column)
    # The release's own text, and the text it was drawn from (lineage: a model trained on the release
    # carries that text too, services.lineage).
    details = {"source": {"dataset": config.dataset, "sentences_key": source.key,
                          TEXT_KEY: table_text_key(home.table_dir(config.dataset, "sentences"))},
               TEXT_KEY: text_key_of(new_texts),
               "identity": {name: identity[name] for name in ("entities", "embeddings")},
               "sanitization": {k: v for k, v in asdict(result).items() if k not in ("dataset", "reused")},
               "figures_version": FIGURES_VERSION, "config": config.model_dump(),
               **({"attack_spec": attack_spec(config)} if config.attack_model else {}),
               "per_split": source.per_split}
    with TableWriter(out_sentences, SENTENCES, key, details) as writer:
        writer.write_batch(sanitized)
        draws.save(writer.side_file(DRAWS_FILE))  # private, like the raw text: stays in this home
        with TableWriter(out_users, USERS, key, details) as users:  # nested: a failure drops all three
            users.write_batch(read_table(home.table_dir(config.dataset, "users")))
            # Empty, so the dataset trains like any other (noiselessly: the text is already private);
            # `uedp detect` on the sanitized dataset replaces it with a real detection.
            _write_empty_entities(home.table_dir(config.output_name, "entities"), key)
    return result


# Raised when a release figure's definition changes, so that figures stored by an older uedp are
# migrated (or refused) rather than reported as current ones. 2: a token released as <unk> is not an
# original token kept.
FIGURES_VERSION = 2


def _reused(home: DataHome, config: SanitizeConfig, key: str, manifest: SentencesManifest, sampler: Sampler,
            unprotected: float, table: pa.Table, texts: list[str], segmenter: Segmenter) -> SanitizeResult:
    """An existing release's figures: recomputed from its draws where this home holds them, otherwise
    those stored with it (an older uedp's migrated to the current definitions); the attack's, for the
    attacker asked for, from :func:`attack_figures`."""
    folder = home.table_dir(config.output_name, "sentences")
    out_users, out_entities = home.table_dir(config.output_name, "users"), home.table_dir(config.output_name, "entities")
    if not is_current(out_users, key):  # a copy of the source's users table: no draw in it
        details = {k: v for k, v in manifest.record.items()
                   if k not in ("rows", "created", "table", "schema_version", "key")}
        with TableWriter(out_users, USERS, key, details) as users:
            users.write_batch(read_table(home.table_dir(config.dataset, "users")))
    entities = entities_manifest_in(out_entities)
    if entities is not None and entities.note == EMPTY_ENTITIES_NOTE and entities.sentences_key != key:  # older uedp
        _write_empty_entities(out_entities, key)
    try:
        draws = Draws.load(folder / DRAWS_FILE)
    except ValueError as exc:
        raise UedpError(f"{exc}; remove {folder.parent} to draw the release again") from None
    if draws is not None:
        result = _summary(config, sampler, unprotected, table, draws.rows, draws.records, draws.released)
    else:
        stored = _current_figures(dict(manifest.detail("sanitization")), manifest.detail("figures_version"))
        result = SanitizeResult(**{k: v for k, v in stored.items() if k not in ATTACK_FIGURES},
                                dataset=config.output_name, reused=True)
    attack = attack_figures(home, config, key, manifest.record, draws, texts, segmenter.text_of)
    return replace(result, reused=True, **attack)


def _current_figures(stored: dict[str, Any], version: int | None) -> dict[str, Any]:
    """Figures stored by an older uedp, in the current definitions. Version 1 counted every token without
    an embedding as kept (<unk> in, <unk> out); each is a sanitized token, so exactly
    ``unknown_share * sanitized_share`` of all tokens are taken off."""
    if version is None or version < 2:
        stored["unchanged_share"] = stored["unchanged_share"] - stored["unknown_share"] * stored["sanitized_share"]
    return stored


def _another_release(config: SanitizeConfig, existing: SentencesManifest, identity: dict[str, Any], folder: Path) -> str:
    """Why a release cannot be drawn under ``config.output_name``: what differs from the one it holds."""
    differs = []
    if existing.source_sentences_key != identity["sentences"]:
        differs.append(f"the text of {config.dataset!r} (ingested again since)")
    stored_identity = existing.detail("identity") or {}
    differs += [what for name, what in (("entities", "the detected entities"), ("embeddings", "the vectors"))
                if name in stored_identity and stored_identity[name] != identity[name]]
    try:
        before = SanitizeConfig.model_validate(existing.detail("config") or {}).release_settings()
    except (ValueError, TypeError):
        before = dict(existing.detail("config") or {})
    differs += [f"{name} ({before.get(name)!r}, now {value!r})" for name, value in identity["config"].items()
                if before.get(name) != value]
    what = "; ".join(differs) or "how it was keyed (an older uedp drew it, or its vectors changed)"
    return (f"sanitized dataset {config.output_name!r} already holds another release: {what}. Drawing a second one "
            f"under the same name would put two releases of the same text in use (their epsilons add up), so uedp "
            f"does not: remove {folder} to replace it, or give this one another name (--output).")


EMPTY_ENTITIES_NOTE = "sanitized dataset: not detected"


def _write_empty_entities(folder: Path, sentences_key: str) -> None:
    with TableWriter(folder, ENTITIES, sentences_key, {"note": EMPTY_ENTITIES_NOTE, "entity_identity": IDENTITY_VERSION,
                                                       "sentences_key": sentences_key}):
        pass


def _sampler(home: DataHome, config: SanitizeConfig, embeddings: Embeddings) -> tuple[Sampler, float]:
    return local_dp_kind(config.mechanism).build(embeddings, config.epsilon, config.k, config.mapping, config.metric,
                                                 home.cache_dir("mappings"))


def _sensitive_spans(home: DataHome, config: SanitizeConfig) -> dict[int, list[tuple[int, int]]]:
    with Catalog(home, config.dataset) as catalog:
        spans = catalog.entity_spans(list(config.categories), "train")
    return {sid: [(s, e) for s, e, _, _ in found] for sid, found in spans.items()}


def _selector(keep: Keep, sensitive: list[tuple[int, int]]) -> Callable[[int, int, str], bool]:
    """Whether a token (span and surface text) goes through the mechanism."""
    if keep == "non-entities":
        return lambda start, end, surface: any(start < e and s < end for s, e in sensitive)
    if keep == "stopwords":
        from spacy.lang.en.stop_words import STOP_WORDS

        return lambda start, end, surface: surface.strip().lower() not in STOP_WORDS
    return lambda start, end, surface: True


def _rebuild(text: str, spans: list[tuple[int, int]], record: np.ndarray, out: np.ndarray,
             segmenter: Segmenter) -> str:
    pieces, cursor = [], 0
    for (start, end), chosen, released in zip(spans, record, out):
        pieces.append(text[cursor:start])
        pieces.append(text[start:end] if chosen == KEEP else segmenter.text_of(int(released)))
        cursor = end
    pieces.append(text[cursor:])
    return "".join(pieces)


# A release of a classification corpus copies each row's class as it is: the draws cover the text's tokens only.
LABELS_CAVEAT = ("the rows' class labels are copied into the release as they are: local DP covers the text's tokens, "
                 "not the labels, so a label (and a classifier trained on the release) is outside the guarantee")


def _summary(config: SanitizeConfig, sampler: Sampler, unprotected: float, table: pa.Table, rows: np.ndarray,
             records: list[np.ndarray], released: list[np.ndarray]) -> SanitizeResult:
    users = table["user_id"].to_pylist()
    figures = release_figures(sampler, [users[row] for row in rows], records, released)
    kind = local_dp_kind(config.mechanism)
    labelled = "label" in table.column_names and table["label"].null_count < len(table)
    return SanitizeResult(
        dataset=config.output_name, reused=False, **asdict(figures), unprotected_share=unprotected,
        statement=kind.statement(config.epsilon, figures.per_token_epsilon, config.keep),
        randomness=config.randomness,
        caveats=(*kind.all_caveats(config.randomness == "seeded"), *((LABELS_CAVEAT,) if labelled else ())),
    )
