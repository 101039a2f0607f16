"""`uedp ner train`: a spaCy NER trained offline from gold tags, scored on held-out sentences, saved as a
pipeline folder that detection loads with --spacy-model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from uedp.cli import app
from uedp.detection.pipeline import DetectorConfig
from uedp.detection.spacy_pipeline import load_pipeline
from uedp.errors import UedpError
from uedp.flows.demo import DEMO_CORPUS
from uedp.services import privacy_budget
from uedp.services.config import TrainConfig
from uedp.services.detect import detect_entities
from uedp.services.ner import LEARNT_SENTENCES_FILE, gold_sentences, train_dataset_ner
from uedp.services.training import train_configuration
from uedp.storage.catalog import Catalog
from uedp.storage.ingest import IngestOptions, ingest

from support import demo_halves, write


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
    # on another corpus (a NER fitted to demo's train split may not detect demo: the next test)
    notes = write(tmp_path / "notes.jsonl", "\n".join(json.dumps({"text": t, "user": f"u{i}"}) for i, t in enumerate([
        "Tamsin Kestrel flew to Leeds on Monday.", "Orchard Foods opened an office in Harbourline.",
        "Call Tamsin Kestrel about the Leeds trip."])))
    ingest(home, "notes", [notes], IngestOptions(format="jsonl", text_col="text", user_col="user"))
    found = detect_entities(home, "notes", DetectorConfig(detectors=["spacy"], spacy_model=str(result.path)))
    with Catalog(home, "notes") as catalog:
        assert set(catalog.detectors()) == {"spacy"} and found.entities == sum(catalog.entities_per_category().values())


def test_a_ner_fitted_to_a_datasets_train_split_may_not_detect_it(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 47, item 5: a NER fitted without noise to the train split makes each sentence's spans depend on
    other users' sentences, which every entity- and token-level guarantee assumes they do not. Refused for the
    dataset, a re-split copy of it and (training) a table detected so before; a NER of another corpus, or of
    the held-out split, still detects."""
    private, public = demo_halves(tmp_path)
    ingest(home, "private", [private], IngestOptions(format="conll2003"))
    ingest(home, "copy", [private], IngestOptions(format="conll2003", split="users", split_seed=9))
    ingest(home, "pub", [public], IngestOptions(format="conll2003", split="users", split_seed=1))
    fitted = train_dataset_ner(home, "private", tmp_path / "ner-private", epochs=10, max_minutes=None).path
    spacy = DetectorConfig(detectors=["spacy"], spacy_model=str(fitted))
    for dataset in ("private", "copy"):
        with pytest.raises(UedpError, match=f"uedp detect {dataset}: the spaCy pipeline .* was trained by `uedp ner "
                                            f"train` and it was fitted to the train split of the text of '{dataset}'"):
            detect_entities(home, dataset, spacy)
    cli = CliRunner().invoke(app, ["detect", "private", "--detector", "spacy,presidio", "--spacy-model", str(fitted),
                                   "--home", str(home.root)])
    assert cli.exit_code == 2 and "on this one's held-out text" in cli.stderr.replace("\n", " "), cli.output
    assert not (home.table_dir("private", "entities") / "data.parquet").exists()  # nothing written

    another = detect_entities(home, "pub", spacy)  # a NER of another corpus detects as usual
    assert another.entities > 0 and not another.reused
    held_out = train_dataset_ner(home, "private", tmp_path / "ner-valid", epochs=2, train_split="valid", dev_split="")
    allowed = detect_entities(home, "private", DetectorConfig(detectors=["spacy"], spacy_model=str(held_out.path)))
    assert (allowed.detector, allowed.reused) == ("spacy", False)  # detected (what it finds: a 13-sentence NER's)
    # the held-out split of a re-split copy holds writers of private's train split (2 of its 3 users, seed 9)
    resplit = train_dataset_ner(home, "copy", tmp_path / "ner-copy-valid", epochs=1, train_split="valid", dev_split="")
    with pytest.raises(UedpError, match="fitted to sentences that users of the train split of 'private' wrote"):
        detect_entities(home, "private", DetectorConfig(detectors=["spacy"], spacy_model=str(resplit.path)))

    # A table detected with it before detection checked (the record set aside, then put back): training on it
    # is refused before anything is spent
    aside = tmp_path / "aside"
    shutil.copytree(fitted, aside)
    (fitted / LEARNT_SENTENCES_FILE).unlink()
    meta = json.loads((fitted / "meta.json").read_text())
    (fitted / "meta.json").write_text(json.dumps({**meta, "description": "someone else's"}))
    detect_entities(home, "private", spacy)
    shutil.rmtree(fitted)
    shutil.copytree(aside, fitted)
    with pytest.raises(UedpError, match="uedp-bounded on 'private': the spaCy pipeline"):
        train_configuration(home, TrainConfig(dataset="private", mechanism="uedp-bounded", categories="PER", rounds=1,
                                              holders_per_entity=1, checkpoint_every=0, threads=1), progress=False)
    assert not privacy_budget.ledger_of(home, "private").read().entries


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
