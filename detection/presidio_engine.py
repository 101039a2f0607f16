"""Presidio's AnalyzerEngine over a spaCy pipeline that uedp has already loaded.

Presidio's own ``SpacyNlpEngine.load`` downloads a model when it is not installed; uedp hands it the
loaded pipeline instead, and feeds ``analyze`` the ``NlpArtifacts`` of texts parsed in batches, so each
text is parsed once for both the spaCy and the Presidio detectors.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
from presidio_analyzer.nlp_engine import NlpArtifacts, SpacyNlpEngine
from presidio_analyzer.predefined_recognizers import PhoneRecognizer
from spacy.language import Language
from spacy.tokens import Doc

from uedp.errors import UedpError

LANGUAGE = "en"
# uedp's recall-first recognizers (phone, e-mail, card, IBAN, SSN, IP and URL shapes, valid or not),
# added to Presidio's own; users copy and edit this file.
DEFAULT_RECOGNIZERS = Path(__file__).with_name("recognizers.yaml")


def use_bundled_public_suffix_list() -> None:
    """Presidio validates e-mail and URL domains with tldextract, which fetches the public suffix list
    over the network on first use (and logs long tracebacks when it cannot). Use its bundled snapshot."""
    import tldextract
    import tldextract.tldextract as module

    module.TLD_EXTRACTOR = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)


class PreloadedSpacyNlpEngine(SpacyNlpEngine):
    """A SpacyNlpEngine around an already loaded pipeline (no download, no second load)."""

    def __init__(self, nlp: Language):
        super().__init__(models=[{"lang_code": LANGUAGE, "model_name": nlp.meta.get("name", "preloaded")}])
        self.nlp = {LANGUAGE: nlp}  # type: ignore[assignment]  # presidio leaves its `self.nlp = None` unannotated

    def load(self) -> None:  # the pipeline is already loaded
        return None

    def artifacts(self, doc: Doc) -> NlpArtifacts:
        """Presidio's view of a parsed Doc. (``process_batch`` would do this too, but it iterates its
        input twice to validate it, which empties a streamed input.)"""
        return self._doc_to_nlp_artifact(doc, LANGUAGE)


def build_analyzer(nlp: Language, recognizers_yaml: str | None = None,
                   defaults: bool = True) -> tuple[AnalyzerEngine, PreloadedSpacyNlpEngine]:
    """Presidio's predefined recognizers (patterns, checksums, the spaCy NER recognizer), uedp's
    recall-first ones (``defaults``: :data:`DEFAULT_RECOGNIZERS`), plus the user's recognizers from a
    YAML file in Presidio's own recognizer format."""
    use_bundled_public_suffix_list()
    # Presidio warns once per non-English recognizer it skips; uedp asks for English only.
    logging.getLogger("presidio-analyzer").setLevel(logging.ERROR)
    engine = PreloadedSpacyNlpEngine(nlp)
    registry = RecognizerRegistry(supported_languages=[LANGUAGE])
    registry.load_predefined_recognizers(nlp_engine=engine, languages=[LANGUAGE])
    for path in ([DEFAULT_RECOGNIZERS] if defaults else []) + ([Path(recognizers_yaml)] if recognizers_yaml else []):
        if not path.is_file():
            raise UedpError(f"recognizer file {path} not found")
        try:
            registry.add_recognizers_from_yaml(path)
        except Exception as exc:  # Presidio raises assorted errors for a malformed file
            raise UedpError(f"{path}: invalid Presidio recognizer file: {str(exc).splitlines()[0]}") from None
    return AnalyzerEngine(registry=registry, nlp_engine=engine, supported_languages=[LANGUAGE]), engine


# A decimal digit (Unicode Nd: what `\d` matches in a str pattern).
HAS_DIGIT = re.compile(r"\d")


def without_digit_only_recognizers(analyzer: AnalyzerEngine) -> AnalyzerEngine:
    """The same analyzer minus recognizers that cannot match a text without a decimal digit, for such texts.

    Only Presidio's own ``PhoneRecognizer`` is dropped (exact type, not a user's subclass): every
    candidate of its ``phonenumbers`` matcher contains ``\\d``, so on a digit-free text it returns nothing
    and analyzing without it gives identical results. It is half of all recognizer time on CoNLL-2003.
    The cheap regex recognizers are left alone: proving each pattern needs a digit is not worth 5 us.
    """
    kept = [r for r in analyzer.registry.recognizers if type(r) is not PhoneRecognizer]
    registry = RecognizerRegistry(recognizers=kept, supported_languages=[LANGUAGE])
    return AnalyzerEngine(registry=registry, nlp_engine=analyzer.nlp_engine, supported_languages=[LANGUAGE])
