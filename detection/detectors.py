"""The detector registry: every detector describes itself here (as mechanisms and corpus formats do), and
the detection pipeline, its configuration's choices and checks, and its cache key iterate over it instead
of naming detectors. A detector says whether it needs the spaCy parse, how it is built once per process
(:attr:`DetectorSpec.build`), and what it finds in one parsed sentence.

uedp's own detectors are defined and registered below: ``gold`` (the corpus' own annotation), ``spacy``
(a pipeline's ``doc.ents``) and ``presidio`` (Presidio's recognizers over the same parse). Rows come out
in registration order within a sentence, whatever order the configuration names them in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from uedp.errors import UedpError

if TYPE_CHECKING:
    from spacy.language import Language
    from spacy.tokens import Doc

# One detection in a sentence: (start, end) character offsets into its text, the detector's label, its score.
Found = tuple[int, int, str, float]


@dataclass(frozen=True, slots=True)
class Parsed:
    """One sentence as the detectors see it: its text, its gold spans, and spaCy's parse of it (``None``
    when no chosen detector needs one)."""

    text: str
    gold: list[dict[str, Any]]
    doc: Doc | None


Finder = Callable[[Parsed], Iterable[Found]]


class Settings(Protocol):
    """What detectors read of the detection configuration (:class:`uedp.detection.pipeline.DetectorConfig`)."""

    @property
    def spacy_model(self) -> str | None: ...
    @property
    def presidio_entities(self) -> list[str] | None: ...
    @property
    def recognizers(self) -> str | None: ...
    @property
    def default_recognizers(self) -> bool: ...
    @property
    def score_threshold(self) -> float: ...


def _no_identity(settings: Settings) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class DetectorSpec:
    name: str
    summary: str  # a few words, for the configuration's description (the Prefect form, --help)
    needs_nlp: bool  # reads spaCy's parse (``Parsed.doc``): the configuration must name a pipeline
    # Builds the detector once per process (a pipeline, an analyzer), given the configuration and the loaded
    # pipeline (``None`` when no chosen detector needs one); returns what it finds in one sentence.
    build: Callable[[Settings, Language | None], Finder]
    # What besides the detector's name and the pipeline changes its predictions: part of the cache key.
    identity: Callable[[Settings], dict[str, Any]] = _no_identity


_DETECTORS: dict[str, DetectorSpec] = {}


def register_detector(spec: DetectorSpec) -> DetectorSpec:
    """Add a detector; its module calls this at import. A name can be registered once."""
    if spec.name in _DETECTORS and _DETECTORS[spec.name] is not spec:
        raise ValueError(f"detector {spec.name!r} is registered twice")
    _DETECTORS[spec.name] = spec
    return spec


def detectors() -> dict[str, DetectorSpec]:
    """Every registered detector, in registration order (the order of rows within a sentence)."""
    return dict(_DETECTORS)


def detector_names() -> tuple[str, ...]:
    return tuple(_DETECTORS)


def get_detector(name: str) -> DetectorSpec:
    if name not in _DETECTORS:
        raise UedpError(f"unknown detector {name!r}; valid: {', '.join(_DETECTORS)}")
    return _DETECTORS[name]


def chosen(names: Iterable[str]) -> list[DetectorSpec]:
    """The named detectors, in registration order."""
    wanted = set(names)
    return [spec for name, spec in _DETECTORS.items() if name in wanted]


# --- gold: the corpus' own entity tags ------------------------------------------------------------------


def _gold(settings: Settings, nlp: Language | None) -> Finder:
    return lambda sentence: ((s["start"], s["end"], s["label"], 1.0) for s in sentence.gold)


register_detector(DetectorSpec(name="gold", summary="the corpus' own tags: CoNLL-2003", needs_nlp=False, build=_gold))


# --- spacy: the pipeline's named entities -----------------------------------------------------------------


def _spacy(settings: Settings, nlp: Language | None) -> Finder:
    def find(sentence: Parsed) -> Iterable[Found]:
        assert sentence.doc is not None, "the spacy detector needs the parse"
        return ((e.start_char, e.end_char, e.label_, 1.0) for e in sentence.doc.ents)

    return find


register_detector(DetectorSpec(name="spacy", summary="a NER pipeline", needs_nlp=True, build=_spacy))


# --- presidio: pattern and context recognizers over the same parse ----------------------------------------


def _presidio(settings: Settings, nlp: Language | None) -> Finder:
    from uedp.detection.presidio_engine import HAS_DIGIT, LANGUAGE, build_analyzer, without_digit_only_recognizers

    assert nlp is not None, "the presidio detector needs the pipeline"
    analyzer, engine = build_analyzer(nlp, settings.recognizers, settings.default_recognizers)
    digit_free_analyzer = without_digit_only_recognizers(analyzer)
    entities, threshold = settings.presidio_entities, settings.score_threshold

    def find(sentence: Parsed) -> Iterable[Found]:
        assert sentence.doc is not None, "the presidio detector needs the parse"
        text = sentence.text
        chosen_analyzer = analyzer if HAS_DIGIT.search(text) else digit_free_analyzer
        results = chosen_analyzer.analyze(text, LANGUAGE, entities=entities, nlp_artifacts=engine.artifacts(sentence.doc),
                                          score_threshold=threshold)
        best: dict[tuple[int, int, str], float] = {}  # several recognizers may report one span
        for r in results:
            key = (r.start, r.end, r.entity_type)
            best[key] = max(best.get(key, 0.0), r.score)
        return [(start, end, label, score) for (start, end, label), score in sorted(best.items())]

    return find


def _presidio_identity(settings: Settings) -> dict[str, Any]:
    import presidio_analyzer

    from uedp.detection.presidio_engine import DEFAULT_RECOGNIZERS

    identity: dict[str, Any] = {
        "presidio_entities": sorted(settings.presidio_entities or []), "score_threshold": settings.score_threshold,
        "presidio": getattr(presidio_analyzer, "__version__", "") or _dist_version("presidio-analyzer"),
    }
    if settings.recognizers:
        identity["recognizers"] = hashlib.sha256(Path(settings.recognizers).read_bytes()).hexdigest()
    if settings.default_recognizers:
        identity["default_recognizers"] = hashlib.sha256(DEFAULT_RECOGNIZERS.read_bytes()).hexdigest()
    return identity


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


register_detector(DetectorSpec(name="presidio", summary="pattern and context recognizers", needs_nlp=True,
                               build=_presidio, identity=_presidio_identity))
