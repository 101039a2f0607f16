"""`uedp ner train`: a spaCy NER trained offline from gold tags, scored on held-out sentences, saved as a
pipeline folder that detection loads with --spacy-model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from uedp.cli import app
from uedp.detection.pipeline import DetectorConfig
from uedp.detection.spacy_pipeline import load_pipeline
from uedp.errors import UedpError
from uedp.flows.demo import DEMO_CORPUS
from uedp.services.detect import detect_entities
from uedp.services.ner import gold_sentences, train_dataset_ner
from uedp.storage.catalog import Catalog
from uedp.storage.ingest import IngestOptions, ingest

from support import write


def test_gold_sentences_carry_canonical_labels_at_character_offsets(home) -> None:  # type: ignore[no-untyped-def]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    sentences = gold_sentences(home, "demo", "train")
    labels = {label for _, spans in sentences for _, _, label in spans}
    assert {"PERSON", "LOC", "ORG", "MISC"} <= labels and "PER" not in labels  # canonical, not the file's tags
    text, spans = next((t, s) for t, s in sentences if s)
    assert all(0 <= start < end <= len(text) and text[start:end].strip() == text[start:end] for start, end, _ in spans)


def test_a_trained_ner_is_scored_saved_and_used_by_detection(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    reports = []
    result = train_dataset_ner(home, "demo", tmp_path / "ner-demo", epochs=6, on_epoch=reports.append)
    assert [r.epoch for r in reports] == list(range(1, 7)) and reports[-1].loss < reports[0].loss
    assert all(r.dev_f1 is not None for r in reports)
    assert {"PERSON", "LOC"} <= set(result.per_label) and result.overall.f1 > 0.2
    assert not list(tmp_path.glob(".*partial"))  # written beside, then moved
    nlp = load_pipeline(str(result.path))
    assert "ner" in nlp.pipe_names
    detect_entities(home, "demo", DetectorConfig(detectors=["gold", "spacy"], spacy_model=str(result.path)))
    with Catalog(home, "demo") as catalog:
        assert set(catalog.detectors()) == {"gold", "spacy"}


def test_the_cli_prints_epochs_the_score_table_and_how_to_use_the_pipeline(home) -> None:  # type: ignore[no-untyped-def]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    result = CliRunner().invoke(app, ["ner", "train", "demo", "--epochs", "2", "--home", str(home.root)])
    assert result.exit_code == 0, result.output
    assert "epoch 1/2: loss" in result.stdout and "epoch 2/2" in result.stdout
    assert "held-out test split" in result.stdout and "PERSON" in result.stdout
    assert f"--spacy-model {home.root / 'models' / 'ner-demo'}" in result.stdout.replace("\n", "")
    assert (home.root / "models" / "ner-demo" / "meta.json").is_file()


def test_a_dataset_without_gold_tags_is_refused_naming_its_format(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    corpus = write(tmp_path / "t.jsonl", "\n".join(json.dumps({"text": f"Line {i}.", "user": f"u{i % 3}"})
                                                   for i in range(20)))
    ingest(home, "t", [corpus], IngestOptions(format="jsonl", text_col="text", user_col="user", split="users"))
    with pytest.raises(UedpError, match="ingested from jsonl files, which carry no gold entity tags"):
        train_dataset_ner(home, "t")


def test_an_output_that_is_not_a_pipeline_is_never_replaced(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    precious = write(tmp_path / "models" / "notes.txt", "mine")
    with pytest.raises(UedpError, match="is not a spaCy pipeline folder"):
        train_dataset_ner(home, "demo", tmp_path / "models", epochs=1)
    assert precious.read_text() == "mine"
    first = train_dataset_ner(home, "demo", tmp_path / "ner", epochs=1)
    again = train_dataset_ner(home, "demo", tmp_path / "ner", epochs=1)  # a pipeline folder is replaced
    assert first.path == again.path and (again.path / "meta.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "models", "ner"]  # no partial or old folders left
