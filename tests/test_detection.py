"""Detection with real spaCy pipelines (built and saved here), real Presidio recognizers, the category
taxonomy, content caching, one parse per text, and coverage against gold tags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import spacy
from pydantic import ValidationError
from spacy.language import Language

from uedp.detection.categories import DEFAULT_TAXONOMY, taxonomy
from uedp.detection.pipeline import DetectorConfig
from uedp.detection.spacy_pipeline import load_pipeline
from uedp.errors import UedpError
from uedp.flows.demo import DEMO_CORPUS
from uedp.services.detect import detect_entities
from uedp.storage.catalog import Catalog
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.tables import read_manifest, read_table

from support import write

SENTENCES = [
    {"text": "Anna Berg met Dr. Imelda Okafor at Northgate Clinic in Leeds.", "user": "u1"},
    {"text": "Write to anna.berg@mailbox.org or call (212) 555-0199 today.", "user": "u1"},
    {"text": "Imelda Okafor moved to Bristol, record MRN-004211.", "user": "u2"},
    {"text": "Nothing sensitive here at all.", "user": "u3"},
]
PATTERNS = [{"label": "PERSON", "pattern": "Anna Berg"}, {"label": "PERSON", "pattern": "Imelda Okafor"},
            {"label": "ORG", "pattern": "Northgate Clinic"}, {"label": "GPE", "pattern": "Leeds"},
            {"label": "GPE", "pattern": "Bristol"}]
RECOGNIZERS = """recognizers:
  - name: "Medical record number"
    supported_language: "en"
    supported_entity: "ID"
    patterns:
      - name: "mrn"
        regex: "MRN-\\\\d{6}"
        score: 0.9
  - name: "Clinics"
    supported_language: "en"
    supported_entity: "ORG"
    deny_list: ["Northgate Clinic"]
"""


@pytest.fixture
def ruler_pipeline(tmp_path: Path) -> Path:
    """A real spaCy pipeline (blank English + EntityRuler), saved and loaded by path as users do."""
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns(PATTERNS)
    nlp.to_disk(tmp_path / "ruler_pipeline")
    return tmp_path / "ruler_pipeline"


@pytest.fixture
def notes(home, tmp_path: Path) -> str:
    path = write(tmp_path / "notes.jsonl", "\n".join(json.dumps(s) for s in SENTENCES))
    ingest(home, "notes", [path], IngestOptions(format="jsonl", text_col="text", user_col="user", split="users",))
    return "notes"


def _rows(home, dataset: str) -> list[tuple]:
    table = read_table(home.table_dir(dataset, "entities")).to_pylist()
    return sorted((r["detector"], r["sentence_id"], r["text"], r["category"]) for r in table)


def test_taxonomy_aliases_composites_and_unknown_names() -> None:
    tax = taxonomy()
    assert tax.resolve("per, ORG") == ["ORG", "PERSON"]
    assert {"PERSON", "PHONE_NUMBER", "GPE", "EMAIL_ADDRESS"} <= set(tax.resolve("PII"))
    assert tax.canonical_of("ORGANIZATION") == "ORG" and tax.canonical_of("NRP") == "NORP"
    with pytest.raises(UedpError, match=r"unknown entity categories SECRET; valid: PERSON,NORP,.*PII"):
        tax.resolve("PERSON,secret")


def test_users_can_edit_the_taxonomy_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    id_line = "  ID:            {aliases: [ID, UUID], coarse: null}\n"
    edited = DEFAULT_TAXONOMY.read_text().replace(id_line, id_line + "  PATIENT_ID:    {aliases: [MRN], coarse: null}\n")
    custom = write(tmp_path / "categories.yaml", edited)
    monkeypatch.setenv("UEDP_CATEGORIES", str(custom))
    assert taxonomy().resolve("mrn") == ["PATIENT_ID"]
    write(tmp_path / "broken.yaml", "categories: [not, a, mapping")
    monkeypatch.setenv("UEDP_CATEGORIES", str(tmp_path / "broken.yaml"))
    with pytest.raises(UedpError, match="cannot read the category taxonomy"):
        taxonomy()


def test_missing_pipeline_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(UedpError, match=r"python -m spacy download en_core_web_trf"):
        load_pipeline("en_core_web_trf")
    with pytest.raises(ValidationError, match="need a spaCy pipeline"):
        DetectorConfig(detectors=["presidio"])


def test_gold_spacy_and_presidio_detectors_combine(home, notes: str, ruler_pipeline: Path, tmp_path: Path) -> None:
    recognizers = write(tmp_path / "recognizers.yaml", RECOGNIZERS)
    config = DetectorConfig(detectors=["spacy", "presidio"], spacy_model=str(ruler_pipeline), recognizers=str(recognizers))
    result = detect_entities(home, notes, config)
    rows = _rows(home, notes)
    spacy_rows = [r for r in rows if r[0] == "spacy"]
    assert ("spacy", 0, "Imelda Okafor", "PERSON") in spacy_rows and ("spacy", 2, "Bristol", "GPE") in spacy_rows
    presidio = {(r[2], r[3]) for r in rows if r[0] == "presidio"}
    assert {("anna.berg@mailbox.org", "EMAIL_ADDRESS"), ("(212) 555-0199", "PHONE_NUMBER"), ("MRN-004211", "ID"),
            ("Northgate Clinic", "ORG"), ("Anna Berg", "PERSON")} <= presidio  # patterns, deny list, spaCy NER
    assert not any(r[1] == 3 for r in rows)  # nothing in the harmless sentence
    assert result.entities == len(rows) and not result.reused
    with Catalog(home, notes) as catalog:
        assert catalog.sensitive_sentence_ids(["PERSON"]) == {0, 2}
        assert catalog.totals(["PERSON"])["entities_spanning_users"] == 1  # Imelda Okafor: users u1 and u2
        assert catalog.totals(["EMAIL_ADDRESS"])["extended_set_S"] == 3


def test_detection_is_cached_by_content_and_categories_are_queries(home, notes: str, ruler_pipeline: Path) -> None:
    config = DetectorConfig(detectors=["spacy"], spacy_model=str(ruler_pipeline))
    first = detect_entities(home, notes, config)
    created = read_manifest(home.table_dir(notes, "entities"))["created"]
    with Catalog(home, notes) as catalog:
        catalog.category_counts(["PERSON"])
        catalog.category_counts(["GPE", "ORG"])
    again = detect_entities(home, notes, DetectorConfig(detectors=["spacy"], spacy_model=str(ruler_pipeline), workers=1,
                                                        batch_size=7))
    assert again.reused and again.entities == first.entities  # batch size does not change predictions
    assert read_manifest(home.table_dir(notes, "entities"))["created"] == created
    nlp = spacy.load(ruler_pipeline)
    nlp.get_pipe("entity_ruler").add_patterns([{"label": "ORG", "pattern": "Nothing"}])
    nlp.to_disk(ruler_pipeline)  # a retrained model in the same folder is another model
    changed = detect_entities(home, notes, config)
    assert not changed.reused and changed.entities == first.entities + 1


_PARSED: list[str] = []


@Language.component("count_parses")
def _count_parses(doc):  # type: ignore[no-untyped-def]
    _PARSED.append(doc.text)
    return doc


def test_each_text_is_parsed_once_for_spacy_and_presidio(home, notes: str, tmp_path: Path) -> None:
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns(PATTERNS)
    nlp.add_pipe("count_parses")
    nlp.to_disk(tmp_path / "counting")
    _PARSED.clear()
    detect_entities(home, notes, DetectorConfig(detectors=["spacy", "presidio"], spacy_model=str(tmp_path / "counting")))
    assert sorted(_PARSED) == sorted(s["text"] for s in SENTENCES)


def test_worker_processes_give_identical_entities(home, tmp_path: Path, ruler_pipeline: Path) -> None:
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold", "spacy"], spacy_model=str(ruler_pipeline)))
    single = _rows(home, "demo")
    (home.table_dir("demo", "entities") / "manifest.json").unlink()  # force a rerun
    detect_entities(home, "demo", DetectorConfig(detectors=["gold", "spacy"], spacy_model=str(ruler_pipeline), workers=2,
                                                 batch_size=64))
    assert _rows(home, "demo") == single and any(r[0] == "spacy" for r in single)


def test_batched_presidio_equals_plain_analyze_per_sentence(home, ruler_pipeline: Path, tmp_path: Path) -> None:
    """uedp skips the phone recognizer on digit-free texts; results must still equal Presidio's own."""
    from uedp.detection.presidio_engine import build_analyzer

    extra = ["Ring ２１２-５５５-０１９９ (full-width digits) after Anna Berg leaves.", "No digits: call Imelda Okafor."]
    texts = [s["text"] for s in SENTENCES] + extra
    path = write(tmp_path / "mixed.jsonl", "\n".join(json.dumps({"text": t, "user": "u"}) for t in texts))
    ingest(home, "mixed", [path], IngestOptions(format="jsonl", text_col="text", user_col="user", split="users"))
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    analyzer, _ = build_analyzer(load_pipeline(str(ruler_pipeline)))
    for dataset in ("mixed", "demo"):
        detect_entities(home, dataset, DetectorConfig(detectors=["presidio"], spacy_model=str(ruler_pipeline)))
        ours = sorted((r["sentence_id"], r["start"], r["end"], round(r["score"], 6))
                      for r in read_table(home.table_dir(dataset, "entities")).to_pylist())
        plain = set()
        for row in read_table(home.table_dir(dataset, "sentences")).to_pylist():
            best: dict[tuple[int, int, str], float] = {}
            for r in analyzer.analyze(row["text"], "en", score_threshold=0.4):
                best[(r.start, r.end, r.entity_type)] = max(best.get((r.start, r.end, r.entity_type), 0.0), r.score)
            plain |= {(row["sentence_id"], s, e, round(v, 6)) for (s, e, _), v in best.items()}
        assert ours == sorted(plain)
    phones = [r["text"] for r in read_table(home.table_dir("mixed", "entities")).to_pylist() if r["category"] == "PHONE_NUMBER"]
    assert "(212) 555-0199" in phones and "２１２-５５５-０１９９" in phones  # the gate was open where it must be


def test_unknown_detector_label_names_the_taxonomy(home, notes: str, tmp_path: Path) -> None:
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "SPACESHIP", "pattern": "Leeds"}])
    nlp.to_disk(tmp_path / "odd")
    with pytest.raises(UedpError, match=r"the spaCy pipeline .*odd: 1 label the category taxonomy .*categories.yaml does not know: SPACESHIP"):
        detect_entities(home, notes, DetectorConfig(detectors=["spacy"], spacy_model=str(tmp_path / "odd")))
    assert read_manifest(home.table_dir(notes, "entities")) is None  # nothing half-written


def test_coverage_against_gold_per_class(home, tmp_path: Path) -> None:
    conll = write(tmp_path / "tiny.conll", "\n".join([
        "-DOCSTART- -X- -X- O", "",
        "Anna NNP I-NP B-PER", "Berg NNP I-NP I-PER", "visited VBD O O", "Leeds NNP I-NP B-LOC", ". . O O", "",
        "Northgate NNP I-NP B-ORG", "Clinic NNP I-NP I-ORG", "called VBD O O", "Imelda NNP I-NP B-PER",
        "Okafor NNP I-NP I-PER", ". . O O", ""]))
    ingest(home, "tiny", [conll], IngestOptions(format="conll2003"))
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([
        {"label": "PERSON", "pattern": "Anna Berg"},          # exact PER
        {"label": "GPE", "pattern": "Leeds"},                 # exact LOC through the coarse map
        {"label": "PERSON", "pattern": "Imelda"},             # partial PER: overlap only
        {"label": "ORG", "pattern": "called"}])               # a wrong ORG
    nlp.to_disk(tmp_path / "cov")
    detect_entities(home, "tiny", DetectorConfig(detectors=["gold", "spacy"], spacy_model=str(tmp_path / "cov")))
    with Catalog(home, "tiny") as catalog:
        rows = {r[0]: r[1:] for r in catalog.coverage("spacy", taxonomy().coarse)}
    assert rows["PER"] == (2, 2, 1, 0.5, 0.5, 1.0)
    assert rows["LOC"] == (1, 1, 1, 1.0, 1.0, 1.0)
    assert rows["ORG"] == (1, 1, 0, 0.0, 0.0, 0.0)


def test_gold_on_a_format_without_gold_tags_is_an_error_naming_the_format(home, notes: str) -> None:
    with pytest.raises(UedpError, match="ingested from jsonl files, which carry no gold entity tags"):
        detect_entities(home, notes, DetectorConfig(detectors=["gold"]))
    assert read_manifest(home.table_dir(notes, "entities")) is None  # nothing written, not an empty table


def test_one_entity_is_one_unit_whatever_category_each_detector_gave_it(home, tmp_path: Path) -> None:
    from uedp.services.config import TrainConfig
    from uedp.services.detect import plan_detection
    from uedp.services.training_data import load_training_texts

    conll = write(tmp_path / "tiny.conll", "\n".join([
        "-DOCSTART- -X- -X- O", "", "Anna NNP I-NP B-PER", "Berg NNP I-NP I-PER", "visited VBD O O",
        "Leeds NNP I-NP B-LOC", ". . O O", "", "Leeds NNP I-NP B-LOC", "won VBD O O", ". . O O", ""]))
    ingest(home, "tiny", [conll], IngestOptions(format="conll2003", split="users"))
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "GPE", "pattern": "Leeds"}])  # gold says LOC
    nlp.to_disk(tmp_path / "gpe")
    config = DetectorConfig(detectors=["gold", "spacy"], spacy_model=str(tmp_path / "gpe"))
    detect_entities(home, "tiny", config)
    rows = read_table(home.table_dir("tiny", "entities")).to_pylist()
    leeds = [r for r in rows if r["text"] == "Leeds"]
    assert {r["category"] for r in leeds} == {"LOC", "GPE"} and {r["entity_key"] for r in leeds} == {"leeds"}
    # Categories still choose: with GPE alone the spaCy detections make the sentences hold "leeds".
    for categories in (["LOC"], ["GPE"], ["LOC", "GPE"]):
        with Catalog(home, "tiny") as catalog:
            training = load_training_texts(catalog, TrainConfig(dataset="tiny", mechanism="uedp", categories=categories))
        keys = {k for sets in training.entities.values() for s in sets for k in s}
        assert keys == {"leeds"}, categories
    # The key's definition is part of the table's content key: tables of another definition are redone.
    assert plan_detection(home, "tiny", config).reused() is not None
    import uedp.services.detect as detect_module

    original = detect_module.IDENTITY_VERSION
    try:
        detect_module.IDENTITY_VERSION = original + 1
        assert plan_detection(home, "tiny", config).reused() is None
    finally:
        detect_module.IDENTITY_VERSION = original


# --- the detector registry: the same rows, identity and configuration as the if-chain it replaced -------------

REGISTRY_SENTENCES = [
    ("Anna Berg met Dr. Imelda Okafor at Northgate Clinic in Leeds.", "u1",
     [{"start": 0, "end": 9, "label": "PER"}, {"start": 55, "end": 60, "label": "LOC"}]),
    ("Write to anna.berg@mailbox.org or call (212) 555-0199 today.", "u1", []),
    ("Imelda Okafor moved to Bristol, record MRN-004211.", "u2", [{"start": 0, "end": 13, "label": "PER"}]),
    ("Nothing sensitive here at all.", "u3", None),
]
# Rows the pipeline gave before detectors became registry entries (computed on that code): gold, spacy and
# presidio in that order within a sentence, whatever order the configuration names them in.
ROWS_BEFORE_REGISTRY = [
    (0, "u1", 0, 9, "PERSON", "gold", 1.0, "Anna Berg"),
    (0, "u1", 55, 60, "LOC", "gold", 1.0, "Leeds"),
    (0, "u1", 0, 9, "PERSON", "spacy", 1.0, "Anna Berg"),
    (0, "u1", 18, 31, "PERSON", "spacy", 1.0, "Imelda Okafor"),
    (0, "u1", 35, 51, "ORG", "spacy", 1.0, "Northgate Clinic"),
    (0, "u1", 55, 60, "GPE", "spacy", 1.0, "Leeds"),
    (0, "u1", 0, 9, "PERSON", "presidio", 0.85, "Anna Berg"),
    (0, "u1", 18, 31, "PERSON", "presidio", 0.85, "Imelda Okafor"),
    (0, "u1", 35, 51, "ORG", "presidio", 0.85, "Northgate Clinic"),
    (0, "u1", 55, 60, "LOC", "presidio", 0.85, "Leeds"),
    (1, "u1", 9, 16, "URL", "presidio", 0.5, "anna.be"),
    (1, "u1", 9, 30, "EMAIL_ADDRESS", "presidio", 1.0, "anna.berg@mailbox.org"),
    (1, "u1", 19, 30, "URL", "presidio", 0.5, "mailbox.org"),
    (1, "u1", 39, 53, "PHONE_NUMBER", "presidio", 0.6, "(212) 555-0199"),
    (2, "u2", 0, 13, "PERSON", "gold", 1.0, "Imelda Okafor"),
    (2, "u2", 0, 13, "PERSON", "spacy", 1.0, "Imelda Okafor"),
    (2, "u2", 23, 30, "GPE", "spacy", 1.0, "Bristol"),
    (2, "u2", 0, 13, "PERSON", "presidio", 0.85, "Imelda Okafor"),
    (2, "u2", 23, 30, "LOC", "presidio", 0.85, "Bristol"),
]


def _detected(config: DetectorConfig) -> list[tuple]:
    import pyarrow as pa

    from uedp.detection.pipeline import detect

    span = pa.struct([("start", pa.int64()), ("end", pa.int64()), ("label", pa.string())])
    schema = pa.schema([("sentence_id", pa.int64()), ("user_id", pa.string()), ("text", pa.string()),
                        ("gold_spans", pa.list_(span))])
    batch = pa.RecordBatch.from_pylist([{"sentence_id": i, "user_id": u, "text": t, "gold_spans": g}
                                        for i, (t, u, g) in enumerate(REGISTRY_SENTENCES)], schema=schema)
    return [(r["sentence_id"], r["user_id"], r["start"], r["end"], r["category"], r["detector"], r["score"], r["text"])
            for chunk in detect([batch], config, taxonomy()) for r in chunk]


def test_registered_detectors_give_the_rows_of_before(ruler_pipeline: Path) -> None:
    gold = [row for row in ROWS_BEFORE_REGISTRY if row[5] == "gold"]
    assert _detected(DetectorConfig(detectors=["gold"])) == gold  # no parse: the gold detector alone
    model = str(ruler_pipeline)
    assert _detected(DetectorConfig(detectors=["presidio", "gold", "spacy"], spacy_model=model)) == ROWS_BEFORE_REGISTRY
    assert _detected(DetectorConfig(detectors=["spacy"], spacy_model=model)) == [
        row for row in ROWS_BEFORE_REGISTRY if row[5] == "spacy"]


def test_detector_configuration_and_identity_are_unchanged(ruler_pipeline: Path) -> None:
    """The identity is the entities table's cache key: the registry must not change it (nor the config's JSON)."""
    from uedp.detection.detectors import detector_names, get_detector

    assert detector_names()[:3] == ("gold", "spacy", "presidio")
    assert [get_detector(n).needs_nlp for n in ("gold", "spacy", "presidio")] == [False, True, True]
    with pytest.raises(UedpError, match="unknown detector 'regex'; valid: gold, spacy, presidio"):
        get_detector("regex")
    schema = DetectorConfig.model_json_schema()["properties"]["detectors"]
    assert schema["items"]["enum"] == ["gold", "spacy", "presidio"]
    assert schema["description"] == ("gold (the corpus' own tags: CoNLL-2003), spacy (a NER pipeline), presidio "
                                     "(pattern and context recognizers)")
    assert DetectorConfig().identity() == {"detectors": ["gold"]}
    config = DetectorConfig(detectors=["presidio", "gold"], spacy_model=str(ruler_pipeline), presidio_entities=["PERSON"])
    identity = config.identity()
    assert set(identity) == {"detectors", "spacy_model", "presidio_entities", "score_threshold", "presidio",
                             "default_recognizers"}
    assert identity["detectors"] == ["gold", "presidio"] and identity["presidio_entities"] == ["PERSON"]
    assert identity["spacy_model"]["path"] == str(ruler_pipeline.resolve())
    assert json.loads(config.model_dump_json()) == {
        "detectors": ["presidio", "gold"], "spacy_model": str(ruler_pipeline), "presidio_entities": ["PERSON"],
        "recognizers": None, "default_recognizers": True, "score_threshold": 0.4, "batch_size": 256, "workers": 1,
        "ignore_entities": None}
    with pytest.raises(ValidationError, match=r"the spacy and presidio detectors need a spaCy pipeline \(--spacy-model"):
        DetectorConfig(detectors=["gold", "spacy"])
