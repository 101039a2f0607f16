"""Run the chosen detectors over a stream of sentences and produce entity rows.

Detectors combine; each is a registry entry (:mod:`uedp.detection.detectors`): ``gold`` (the corpus' own
annotation), ``spacy`` (a pipeline's ``doc.ents``) and ``presidio`` (Presidio's recognizers: patterns with
checksums and context, the spaCy NER recognizer, and user recognizers from YAML). Texts are parsed once, in
batches (``nlp.pipe``, optionally in worker processes), and the same parse feeds every detector that needs it.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import re
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from uedp.detection import detectors as detector_registry
from uedp.detection.categories import Taxonomy
from uedp.detection.categories import taxonomy as taxonomy_in_force
from uedp.detection.detectors import DetectorSpec, Finder, Parsed
from uedp.detection.identity import entity_key, normalize_surface
from uedp.errors import UedpError

if TYPE_CHECKING:  # the registry builds it at import; to a type checker it is its base
    DetectorName = str
else:
    DetectorName = Literal[detector_registry.detector_names()]  # a choice list in the Prefect UI and in JSON schemas

ROWS_PER_CHUNK = 10_000


def _default_detectors() -> list[DetectorName]:
    return ["gold"]


class DetectorConfig(BaseModel):
    """Which detectors, with which models; everything that changes predictions is in the cache key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    detectors: list[DetectorName] = Field(default_factory=_default_detectors, min_length=1,
                                          description=", ".join(f"{name} ({spec.summary})"
                                                                for name, spec in detector_registry.detectors().items()))
    spacy_model: str | None = Field(None, description="installed package name or folder of a spaCy pipeline")
    presidio_entities: list[str] | None = Field(None, description="Presidio entity types to ask for (default all)")
    recognizers: str | None = Field(None, description="YAML file of extra recognizers, Presidio's format")
    default_recognizers: bool = Field(True, description="add uedp's recall-first recognizers (phone, e-mail, card, "
                                      "IBAN, SSN, IP and URL shapes, valid or not) to Presidio's own")
    score_threshold: float = Field(0.4, ge=0, le=1, description="drop Presidio results scored below this")
    batch_size: int = Field(256, ge=1, description="sentences per spaCy batch (speed only: results are the same)")
    workers: int = Field(1, ge=1, description="worker processes for the spaCy and Presidio pass")
    # Issue 37: surfaces the curator found to be false positives (a greeting, a placeholder); part of the
    # cache key by the file's rules, not its path, so editing the file detects again.
    ignore_entities: str | None = Field(None, description="text file of entity surfaces to drop from the entities "
                                        "table: one a line, or CATEGORY: surface; # comments; case-insensitive")

    @model_validator(mode="after")
    def _needs_model(self) -> DetectorConfig:
        if self.needs_nlp and not self.spacy_model:
            parsing = [name for name, spec in detector_registry.detectors().items() if spec.needs_nlp]
            raise ValueError(f"the {' and '.join(parsing)} detectors need a spaCy pipeline "
                             "(--spacy-model NAME_OR_PATH)")
        return self

    @field_validator("ignore_entities")
    @classmethod
    def _readable_ignore_list(cls, value: str | None) -> str | None:
        if value:
            try:
                read_ignore_list(value)  # a missing file or a malformed line is refused before any work
            except UedpError as exc:
                raise ValueError(str(exc)) from None
        return value

    @property
    def chosen(self) -> list[DetectorSpec]:
        """The chosen detectors, in registry order (the order of their rows within a sentence)."""
        return detector_registry.chosen(self.detectors)

    @property
    def needs_nlp(self) -> bool:
        return any(spec.needs_nlp for spec in self.chosen)

    def identity(self) -> dict[str, Any]:
        """The parts that change predictions (not batch size or workers), for the cache key."""
        identity: dict[str, Any] = {"detectors": sorted(self.detectors)}
        if self.needs_nlp:
            from uedp.detection.spacy_pipeline import pipeline_identity  # spaCy: where a pipeline is named

            identity["spacy_model"] = pipeline_identity(self.spacy_model or "")
        for spec in self.chosen:
            identity |= spec.identity(self)
        if self.ignore_entities and (ignored := read_ignore_list(self.ignore_entities)).rules:
            identity["ignore_entities"] = ignored.digest()
        return identity


# --- the curator's list of surfaces that are not entities (--ignore-entities) ----------------------------
# ``CATEGORY: surface`` when the line starts with a word in capitals and a colon; anything else is a surface.
_CATEGORY_LINE = re.compile(r"^([A-Z][A-Z0-9_]*(?:-[A-Z0-9_]+)*)\s*:(.*)$")  # CREATIVE-WORK from --label too


@dataclass(frozen=True)
class IgnoreList:
    """Surfaces detection drops, matched as entities are identified (:func:`normalize_surface`: case-folded,
    whitespace collapsed), in every category (category ``None``) or in the named ones."""

    source: str
    rules: frozenset[tuple[str | None, str]]

    @property
    def surfaces(self) -> int:
        """How many surfaces the curator listed (a count of the list, not of the data)."""
        return len({surface for _, surface in self.rules})

    def drops(self, category: str, key: str) -> bool:
        return (None, key) in self.rules or (category, key) in self.rules

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(sorted(self.rules, key=lambda r: (r[0] or "", r[1]))).encode()).hexdigest()


def read_ignore_list(path: str | Path) -> IgnoreList:
    """The rules of an ``--ignore-entities`` file: one surface a line, or ``CATEGORY: surface`` (a category,
    alias or composite of the taxonomy) to drop it only there; ``#`` starts a comment line; blank lines are
    skipped. A missing or unreadable file, an unknown category or a category without a surface is an error
    naming the file (and the line)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise UedpError(f"cannot read the --ignore-entities file {path}: {reason}") from None
    rules: set[tuple[str | None, str]] = set()
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        categories: list[str | None] = [None]
        if match := _CATEGORY_LINE.match(line):
            name, line = match.group(1), match.group(2).strip()
            tax = taxonomy_in_force()
            if name not in tax.alias_to_canonical and name not in tax.composites:
                raise UedpError(f"{path}, line {number}: unknown category {name} (a line 'CATEGORY: surface' names a "
                                f"category of {tax.source}: {', '.join(tax.names())}; write other surfaces without a "
                                "capitalised word and a colon in front)")
            categories = list(tax.resolve(name))
            if not line:
                raise UedpError(f"{path}, line {number}: no surface after {name}: (write 'CATEGORY: surface')")
        rules.update((category, normalize_surface(line)) for category in categories)
    return IgnoreList(str(path), frozenset(rules))


class _Rows:
    """Builds entity rows with canonical categories; an unknown label is an error naming the file to edit."""

    def __init__(self, taxonomy: Taxonomy):
        self.taxonomy = taxonomy

    def make(self, sentence_id: int, user_id: str, text: str, start: int, end: int, label: str, detector: str,
             score: float) -> dict[str, object]:
        category = self.taxonomy.canonical_of(label)
        if category is None:
            raise UedpError(f"detector {detector} emitted label {label!r}, which the category taxonomy "
                            f"{self.taxonomy.source} does not know; {self.taxonomy.how_to_add(label)}")
        surface = text[start:end]
        return {"sentence_id": sentence_id, "user_id": user_id, "start": start, "end": end, "category": category,
                "detector": detector, "score": float(score), "entity_key": entity_key(surface), "text": surface}


def detect(batches: Iterable[pa.RecordBatch], config: DetectorConfig, taxonomy: Taxonomy) -> Iterator[list[dict[str, object]]]:
    """Entity rows for sentence batches (columns sentence_id, user_id, text, gold_spans), in chunks.

    With ``workers > 1`` the whole pass (parse and recognizers) runs in that many processes, each with
    its own pipeline and analyzer; chunks come back in input order, and at most two per worker are in
    flight, so memory stays bounded.
    """
    sentences = _sentences(batches)
    if config.workers > 1 and config.needs_nlp:
        yield from _detect_in_workers(sentences, config, taxonomy)
    else:
        yield from _detector(config, taxonomy).run(sentences)


_DETECTORS: dict[tuple[str, str], _Detector] = {}


def _detector(config: DetectorConfig, taxonomy: Taxonomy) -> _Detector:
    """One detector per process, configuration and model content: a process that detects many shards
    (a Dask worker) loads the spaCy pipeline and builds the Presidio analyzer once, not once per shard.
    The key holds the pipeline's content hash, so a model retrained in the same folder is reloaded."""
    key = (config.model_dump_json(), json.dumps(config.identity(), sort_keys=True))
    if key not in _DETECTORS:
        _DETECTORS.clear()  # keep one: pipelines are large
        _DETECTORS[key] = _Detector(config, taxonomy)
    detector = _DETECTORS[key]
    detector.rows = _Rows(taxonomy)  # cheap; the taxonomy in force may have been edited since
    return detector


Sentence = tuple[int, str, str, list[dict[str, Any]]]


# spaCy components that set doc.ents and list their labels (a trained NER, a rule-based entity ruler).
ENTITY_PIPES = ("ner", "entity_ruler")


class _Detector:
    """One process's detectors: the pipeline and each detector (an analyzer, ...) are built once, then fed
    any number of texts."""

    def __init__(self, config: DetectorConfig, taxonomy: Taxonomy):
        self.config, self.rows = config, _Rows(taxonomy)
        from uedp.detection.spacy_pipeline import load_pipeline

        self.nlp = load_pipeline(config.spacy_model or "") if config.needs_nlp else None
        if self.nlp is not None and "spacy" in config.detectors:
            # every entity label the pipeline can emit, at once, before the pass (not one per run as it meets them)
            labels = {label for name in ENTITY_PIPES if name in self.nlp.pipe_names
                      for label in self.nlp.get_pipe(name).labels}  # type: ignore[attr-defined]
            taxonomy.refuse_unknown(labels, f"the spaCy pipeline {config.spacy_model}")
        self.finders: list[tuple[str, Finder]] = [(spec.name, spec.build(config, self.nlp)) for spec in config.chosen]
        self.ignored = read_ignore_list(config.ignore_entities) if config.ignore_entities else None

    def run(self, sentences: Iterable[Sentence]) -> Iterator[list[dict[str, object]]]:
        chunk: list[dict[str, object]] = []
        for sentence_rows in self._rows_per_sentence(sentences):
            chunk += sentence_rows
            if len(chunk) >= ROWS_PER_CHUNK:
                yield chunk
                chunk = []
        yield chunk

    def _parsed(self, sentences: Iterable[Sentence]) -> Iterator[tuple[int, str, Parsed]]:
        """``(sentence_id, user_id, parsed)``; parsed in batches when a chosen detector reads the parse."""
        if self.nlp is None:
            for sentence_id, user_id, text, gold in sentences:
                yield sentence_id, user_id, Parsed(text, gold, None)
            return
        stream = ((text, (sentence_id, user_id, gold)) for sentence_id, user_id, text, gold in sentences)
        for doc, (sentence_id, user_id, gold) in self.nlp.pipe(stream, as_tuples=True, batch_size=self.config.batch_size):
            yield sentence_id, user_id, Parsed(doc.text, gold, doc)

    def _rows_per_sentence(self, sentences: Iterable[Sentence]) -> Iterator[list[dict[str, object]]]:
        make = self.rows.make
        ignored = self.ignored if self.ignored is not None and self.ignored.rules else None
        for sentence_id, user_id, sentence in self._parsed(sentences):
            text = sentence.text
            rows = [make(sentence_id, user_id, text, start, end, label, name, score)
                    for name, find in self.finders for start, end, label, score in find(sentence)]
            if ignored is not None:
                rows = [row for row in rows if not ignored.drops(str(row["category"]), str(row["entity_key"]))]
            yield rows


# --- worker processes -------------------------------------------------------------------------
SENTENCES_PER_TASK = 500
_WORKER: _Detector | None = None


def _init_worker(config_json: str, taxonomy: Taxonomy) -> None:
    global _WORKER
    config = DetectorConfig.model_validate_json(config_json).model_copy(update={"workers": 1})
    _WORKER = _Detector(config, taxonomy)  # the parent's, labels file merged: pickled, not re-read


def _work(sentences: list[Sentence]) -> list[dict[str, object]]:
    assert _WORKER is not None, "worker not initialised"
    return [row for rows in _WORKER.run(sentences) for row in rows]


def _detect_in_workers(sentences: Iterable[Sentence], config: DetectorConfig,
                       taxonomy: Taxonomy) -> Iterator[list[dict[str, object]]]:
    # spawn, not fork: the parent may run threads (Prefect's client), which fork does not copy safely.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(config.workers, mp_context=context, initializer=_init_worker,
                             initargs=(config.model_dump_json(), taxonomy)) as pool:
        pending: deque[Future[list[dict[str, object]]]] = deque()
        for task in _batched(sentences, SENTENCES_PER_TASK):
            pending.append(pool.submit(_work, task))
            if len(pending) >= 2 * config.workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _batched(items: Iterable[Sentence], size: int) -> Iterator[list[Sentence]]:
    batch: list[Sentence] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _sentences(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[int, str, str, list[dict[str, Any]]]]:
    for batch in batches:
        yield from zip(batch.column("sentence_id").to_pylist(), batch.column("user_id").to_pylist(),
                       batch.column("text").to_pylist(), (s or [] for s in batch.column("gold_spans").to_pylist()))
