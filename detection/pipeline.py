"""Run the chosen detectors over a stream of sentences and produce entity rows.

Detectors combine: ``gold`` (the corpus' own annotation), ``spacy`` (a pipeline's ``doc.ents``) and
``presidio`` (Presidio's recognizers: patterns with checksums and context, the spaCy NER recognizer,
and user recognizers from YAML). Texts are parsed once, in batches (``nlp.pipe``, optionally in
worker processes), and the same parse feeds both the spaCy and the Presidio detectors.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from uedp.detection.categories import Taxonomy
from uedp.detection.identity import entity_key
from uedp.detection.presidio_engine import (
    DEFAULT_RECOGNIZERS,
    HAS_DIGIT,
    LANGUAGE,
    PreloadedSpacyNlpEngine,
    build_analyzer,
    without_digit_only_recognizers,
)
from uedp.detection.spacy_pipeline import load_pipeline, pipeline_identity
from uedp.errors import UedpError

DetectorName = Literal["gold", "spacy", "presidio"]
ROWS_PER_CHUNK = 10_000


def _default_detectors() -> list[DetectorName]:
    return ["gold"]


class DetectorConfig(BaseModel):
    """Which detectors, with which models; everything that changes predictions is in the cache key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    detectors: list[DetectorName] = Field(default_factory=_default_detectors, min_length=1,
                                          description="gold (the corpus' own tags: CoNLL-2003), spacy (a NER "
                                          "pipeline), presidio (pattern and context recognizers)")
    spacy_model: str | None = Field(None, description="installed package name or folder of a spaCy pipeline")
    presidio_entities: list[str] | None = Field(None, description="Presidio entity types to ask for (default all)")
    recognizers: str | None = Field(None, description="YAML file of extra recognizers, Presidio's format")
    default_recognizers: bool = Field(True, description="add uedp's recall-first recognizers (phone, e-mail, card, "
                                      "IBAN, SSN, IP and URL shapes, valid or not) to Presidio's own")
    score_threshold: float = Field(0.4, ge=0, le=1, description="drop Presidio results scored below this")
    batch_size: int = Field(256, ge=1, description="sentences per spaCy batch (speed only: results are the same)")
    workers: int = Field(1, ge=1, description="worker processes for the spaCy and Presidio pass")

    @model_validator(mode="after")
    def _needs_model(self) -> DetectorConfig:
        if {"spacy", "presidio"} & set(self.detectors) and not self.spacy_model:
            raise ValueError("the spacy and presidio detectors need a spaCy pipeline (--spacy-model NAME_OR_PATH)")
        return self

    @property
    def needs_nlp(self) -> bool:
        return bool({"spacy", "presidio"} & set(self.detectors))

    def identity(self) -> dict[str, Any]:
        """The parts that change predictions (not batch size or workers), for the cache key."""
        identity: dict[str, Any] = {"detectors": sorted(self.detectors)}
        if self.needs_nlp:
            identity["spacy_model"] = pipeline_identity(self.spacy_model or "")
        if "presidio" in self.detectors:
            import presidio_analyzer

            identity |= {"presidio_entities": sorted(self.presidio_entities or []),
                         "score_threshold": self.score_threshold,
                         "presidio": getattr(presidio_analyzer, "__version__", "") or _dist_version("presidio-analyzer")}
            if self.recognizers:
                identity["recognizers"] = hashlib.sha256(Path(self.recognizers).read_bytes()).hexdigest()
            if self.default_recognizers:
                identity["default_recognizers"] = hashlib.sha256(DEFAULT_RECOGNIZERS.read_bytes()).hexdigest()
        return identity


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


class _Rows:
    """Builds entity rows with canonical categories; an unknown label is an error naming the file to edit."""

    def __init__(self, taxonomy: Taxonomy):
        self.taxonomy = taxonomy

    def make(self, sentence_id: int, user_id: str, text: str, start: int, end: int, label: str, detector: str,
             score: float) -> dict[str, object]:
        category = self.taxonomy.canonical_of(label)
        if category is None:
            raise UedpError(f"detector {detector} emitted label {label!r}, which the category taxonomy "
                            f"{self.taxonomy.source} does not know; add it there (or to the file UEDP_CATEGORIES names)")
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


class _Detector:
    """One process's detectors: the pipeline and analyzer are built once, then fed any number of texts."""

    def __init__(self, config: DetectorConfig, taxonomy: Taxonomy):
        self.config, self.rows = config, _Rows(taxonomy)
        self.nlp = load_pipeline(config.spacy_model or "") if config.needs_nlp else None
        self.analyzer, self.engine = (None, None)
        if "presidio" in config.detectors and self.nlp is not None:
            self.analyzer, self.engine = build_analyzer(self.nlp, config.recognizers, config.default_recognizers)
            self.digit_free_analyzer = without_digit_only_recognizers(self.analyzer)
        elif self.nlp is not None:
            self.engine = PreloadedSpacyNlpEngine(self.nlp)

    def run(self, sentences: Iterable[Sentence]) -> Iterator[list[dict[str, object]]]:
        chunk: list[dict[str, object]] = []
        for sentence_rows in self._rows_per_sentence(sentences):
            chunk += sentence_rows
            if len(chunk) >= ROWS_PER_CHUNK:
                yield chunk
                chunk = []
        yield chunk

    def _rows_per_sentence(self, sentences: Iterable[Sentence]) -> Iterator[list[dict[str, object]]]:
        make, detectors = self.rows.make, self.config.detectors
        if self.nlp is None:
            for sentence_id, user_id, text, gold in sentences:
                yield [make(sentence_id, user_id, text, s["start"], s["end"], s["label"], "gold", 1.0) for s in gold]
            return
        stream = ((text, (sentence_id, user_id, gold)) for sentence_id, user_id, text, gold in sentences)
        for doc, (sentence_id, user_id, gold) in self.nlp.pipe(stream, as_tuples=True, batch_size=self.config.batch_size):
            text, rows = doc.text, []
            if "gold" in detectors:
                rows += [make(sentence_id, user_id, text, s["start"], s["end"], s["label"], "gold", 1.0) for s in gold]
            if "spacy" in detectors:
                rows += [make(sentence_id, user_id, text, e.start_char, e.end_char, e.label_, "spacy", 1.0)
                         for e in doc.ents]
            if self.analyzer is not None and self.engine is not None:
                analyzer = self.analyzer if HAS_DIGIT.search(text) else self.digit_free_analyzer
                results = analyzer.analyze(text, LANGUAGE, entities=self.config.presidio_entities,
                                           nlp_artifacts=self.engine.artifacts(doc),
                                           score_threshold=self.config.score_threshold)
                best: dict[tuple[int, int, str], float] = {}  # several recognizers may report one span
                for r in results:
                    key = (r.start, r.end, r.entity_type)
                    best[key] = max(best.get(key, 0.0), r.score)
                rows += [make(sentence_id, user_id, text, start, end, label, "presidio", score)
                         for (start, end, label), score in sorted(best.items())]
            yield rows


# --- worker processes -------------------------------------------------------------------------
SENTENCES_PER_TASK = 500
_WORKER: _Detector | None = None


def _init_worker(config_json: str, taxonomy_source: str) -> None:
    global _WORKER
    from uedp.detection.categories import load_taxonomy

    config = DetectorConfig.model_validate_json(config_json).model_copy(update={"workers": 1})
    _WORKER = _Detector(config, load_taxonomy(Path(taxonomy_source)))


def _work(sentences: list[Sentence]) -> list[dict[str, object]]:
    assert _WORKER is not None, "worker not initialised"
    return [row for rows in _WORKER.run(sentences) for row in rows]


def _detect_in_workers(sentences: Iterable[Sentence], config: DetectorConfig,
                       taxonomy: Taxonomy) -> Iterator[list[dict[str, object]]]:
    # spawn, not fork: the parent may run threads (Prefect's client), which fork does not copy safely.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(config.workers, mp_context=context, initializer=_init_worker,
                             initargs=(config.model_dump_json(), taxonomy.source)) as pool:
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
