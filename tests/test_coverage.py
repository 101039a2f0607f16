"""Detector coverage stored with the entities table, and the recall every entity-level epsilon is
printed and logged next to (measured on held-out gold tags of the chosen categories, or unmeasured)."""

from __future__ import annotations

import json
from pathlib import Path

import spacy
from mlflow.tracking import MlflowClient

from uedp.detection.pipeline import DetectorConfig
from uedp.flows.demo import DEMO_CORPUS
from uedp.services.config import TrainConfig
from uedp.services.coverage import ANY, COVERAGE_FILE, detector_recall, stored_coverage
from uedp.services.detect import detect_entities
from uedp.services.training import train_configuration
from uedp.storage.catalog import Catalog
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.tables import read_manifest

from support import write

# Gold: PER Anna Berg, LOC Leeds, ORG Northgate Clinic, PER Imelda Okafor, in a file named valid: every
# sentence is held out.
TINY = "\n".join([
    "-DOCSTART- -X- -X- O", "",
    "Anna NNP I-NP B-PER", "Berg NNP I-NP I-PER", "visited VBD O O", "Leeds NNP I-NP B-LOC", ". . O O", "",
    "Northgate NNP I-NP B-ORG", "Clinic NNP I-NP I-ORG", "called VBD O O", "Imelda NNP I-NP B-PER",
    "Okafor NNP I-NP I-PER", ". . O O", ""])


def _recall(home, dataset: str, categories: list[str]):  # type: ignore[no-untyped-def]
    with Catalog(home, dataset) as catalog:
        return detector_recall(catalog, categories)


def _ruler(path: Path, patterns: list[dict[str, str]]) -> Path:
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns(patterns)
    nlp.to_disk(path)
    return path


def test_coverage_is_stored_with_the_table_it_describes(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    conll = write(tmp_path / "valid.conll", TINY)  # a file named valid: every sentence is held out
    ingest(home, "tiny", [conll], IngestOptions(format="conll2003"))
    model = _ruler(tmp_path / "ruler", [{"label": "PERSON", "pattern": "Anna Berg"}, {"label": "GPE", "pattern": "Leeds"}])
    detect_entities(home, "tiny", DetectorConfig(detectors=["gold", "spacy"], spacy_model=str(model)))
    folder = home.table_dir("tiny", "entities")
    stored = json.loads((folder / COVERAGE_FILE).read_text())
    assert stored["entities_key"] == read_manifest(folder)["key"]  # type: ignore[index]
    rows = {r["class"]: r for r in stored["coverage"]["held_out"]["spacy"]}
    assert (rows["PER"]["gold"], rows["PER"]["overlap_recall"]) == (2, 0.5)
    assert (rows["LOC"]["gold"], rows["LOC"]["overlap_recall"]) == (1, 1.0)
    # The recall an epsilon rests on: gold spans of the chosen categories' classes, found by detections
    # of the chosen categories (what the run protects). spaCy's GPE "Leeds" protects nothing under LOC.
    assert _recall(home, "tiny", ["PERSON"]).value == 0.5
    assert _recall(home, "tiny", ["LOC", "GPE"]).value == 1.0
    assert _recall(home, "tiny", ["LOC"]).value == 0.0
    assert _recall(home, "tiny", ["PERSON", "LOC", "ORG"]).value == 1 / 4
    assert "detector recall 0.500" in _recall(home, "tiny", ["PERSON"]).describe()
    contact = _recall(home, "tiny", ["PERSON", "PHONE_NUMBER"])
    assert contact.unmeasured == ("PHONE_NUMBER",) and "unmeasured for PHONE_NUMBER" in contact.describe()
    # A stale file (another table) is recomputed, not reused.
    (folder / COVERAGE_FILE).write_text(json.dumps({"entities_key": "old", "coverage": {}}))
    assert stored_coverage(home, "tiny")["held_out"]["spacy"]


def test_several_detectors_count_a_gold_span_found_by_any_of_them(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    conll = write(tmp_path / "valid.conll", TINY)
    ingest(home, "tiny", [conll], IngestOptions(format="conll2003"))
    model = _ruler(tmp_path / "ruler", [{"label": "PERSON", "pattern": "Anna Berg"}])
    recognizers = write(tmp_path / "r.yaml", 'recognizers:\n  - name: "okafor"\n    supported_language: "en"\n'
                                             '    supported_entity: "PERSON"\n    deny_list: ["Imelda Okafor"]\n')
    detect_entities(home, "tiny", DetectorConfig(detectors=["gold", "spacy", "presidio"], spacy_model=str(model),
                                                 recognizers=str(recognizers)))
    held_out = stored_coverage(home, "tiny")["held_out"]
    assert {r["class"]: r["overlap_recall"] for r in held_out["spacy"]}["PER"] == 0.5
    assert {r["class"]: r["overlap_recall"] for r in held_out[ANY]}["PER"] == 1.0
    assert _recall(home, "tiny", ["PERSON"]).value == 1.0


def test_without_gold_the_recall_is_said_to_be_unmeasured_and_with_gold_only_exact(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    corpus = write(tmp_path / "t.jsonl", "\n".join(json.dumps({"text": f"Anna Berg wrote {i}.", "user": f"u{i % 3}"})
                                                   for i in range(12)))
    ingest(home, "t", [corpus], IngestOptions(format="jsonl", text_col="text", user_col="user", split="users"))
    model = _ruler(tmp_path / "ruler", [{"label": "PERSON", "pattern": "Anna Berg"}])
    detect_entities(home, "t", DetectorConfig(detectors=["spacy"], spacy_model=str(model)))
    recall = _recall(home, "t", ["PERSON"])
    assert recall.value is None and recall.describe().startswith("detector recall unmeasured (no gold tags")
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    gold = _recall(home, "demo", ["PERSON"])
    assert gold.how == "gold only" and gold.value is None  # nothing measured, so no figure is logged


def test_an_entity_level_run_logs_and_reports_the_recall_beside_its_epsilon(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    model = _ruler(tmp_path / "ruler", [{"label": "GPE", "pattern": "Leeds"}, {"label": "PERSON", "pattern": "Anna Berg"}])
    detect_entities(home, "demo", DetectorConfig(detectors=["gold", "spacy"], spacy_model=str(model)))
    config = TrainConfig(dataset="demo", mechanism="uedp-bounded", rounds=2, holders_per_entity=1, q_user=0.5,
                         noise_multiplier=2.0, categories=["PERSON"], local_steps=1, threads=1, checkpoint_every=0)
    result = train_configuration(home, config, progress=False)
    expected = _recall(home, "demo", ["PERSON"])
    assert expected.value is not None and 0 <= expected.value < 1
    assert result.detector_recall == expected.describe()
    run = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(result.run_id)
    assert run.data.metrics["detector_recall"] == expected.value
    assert run.data.params["privacy_detector_recall"] == expected.describe()
    assert any(expected.describe() in caveat for caveat in result.caveats)


def test_an_entities_table_of_an_older_identity_is_refused_for_training(home) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from uedp.errors import UedpError

    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    manifest_path = home.table_dir("demo", "entities") / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["entity_identity"] == 2
    manifest.pop("entity_identity")  # as an older uedp wrote it
    manifest_path.write_text(json.dumps(manifest))
    config = TrainConfig(dataset="demo", mechanism="uedp-bounded", rounds=1, noise_multiplier=2.0, threads=1)
    with pytest.raises(UedpError, match="keys entities by category and surface"):
        train_configuration(home, config, progress=False)
