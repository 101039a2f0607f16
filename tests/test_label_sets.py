"""Real label sets (issue 37): CoNLL entity types with hyphens (``B-creative-work``), and labels outside the
taxonomy (a corpus' ``group``, a recognizer's ``TRACKING_NUMBER``) mapped or added from the command line
(``uedp detect --label``) or the data home's ``labels.yaml``, seen by every command that resolves categories."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from uedp.commands import app
from uedp.detection.categories import DEFAULT_TAXONOMY, taxonomy
from uedp.detection.pipeline import DetectorConfig
from uedp.errors import UedpError
from uedp.services.config import TrainConfig
from uedp.services.detect import detect_entities
from uedp.storage.formats import FormatError
from uedp.storage.formats.conll import read_conll
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.tables import read_manifest, read_table

from support import write

runner = CliRunner()

PEOPLE = ["Anna", "Imelda", "Tamsin", "Ola", "Priya", "Jonas", "Mei", "Kofi"]


def corpus(documents: int = 8) -> str:
    """A small CoNLL file (one document per user) whose types hold hyphens or lie outside the taxonomy."""
    lines: list[str] = []
    for d in range(documents):
        name = PEOPLE[d % len(PEOPLE)]
        lines += ["-DOCSTART- -X- -X- O", "",
                  f"{name} NNP B-NP B-PER", "read VBD B-VP O", "Moby NNP B-NP B-creative-work",
                  "Dick NNP I-NP I-creative-work", "with IN B-PP O", "the DT B-NP B-group",
                  "Harbour NNP I-NP I-group", "Readers NNPS I-NP I-group", ". . O O", "",
                  f"{name} NNP B-NP B-PER", "wrote VBD B-VP O", "again RB B-ADVP O", "today NN B-NP O", ". . O O", ""]
    return "\n".join(lines)


@pytest.fixture(autouse=True)
def _labels_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI points UEDP_LABELS at its home's labels file for the rest of the process: undo it after each test
    (and start each without it, or UEDP_CATEGORIES)."""
    monkeypatch.delenv("UEDP_LABELS", raising=False)
    monkeypatch.delenv("UEDP_CATEGORIES", raising=False)


def _ingested(home, tmp_path: Path, name: str = "labelled") -> str:  # type: ignore[no-untyped-def]
    ingest(home, name, [write(tmp_path / f"{name}.train", corpus())], IngestOptions(format="conll2003"))
    return name


def _entities(home, dataset: str) -> set[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return {(r["text"], r["category"]) for r in read_table(home.table_dir(dataset, "entities")).to_pylist()}


def test_conll_types_may_hold_hyphens_split_on_the_first_one(tmp_path: Path) -> None:
    sentences = list(read_conll(write(tmp_path / "x.conll", corpus(1))))
    first = sentences[0]
    assert [(first.text[s["start"]:s["end"]], s["label"]) for s in first.spans()] == [
        ("Anna", "PER"), ("Moby Dick", "creative-work"), ("the Harbour Readers", "group")]
    # BIOES and IOB1 continuation of a hyphenated type: E- closes it, I- continues only the same type
    bioes = write(tmp_path / "bioes.conll", "Big NNP B-NP B-work-of-art\nFish NNP I-NP E-work-of-art\n"
                                            "Small NNP B-NP I-work-of-art\nTown NNP I-NP I-creative-work\n")
    (only,) = read_conll(bioes)
    assert [(only.text[s["start"]:s["end"]], s["label"]) for s in only.spans()] == [
        ("Big Fish", "work-of-art"), ("Small", "work-of-art"), ("Town", "creative-work")]


@pytest.mark.parametrize("tag", ["B-", "B--work", "B-work-", "B-creative--work", "X-creative-work", "B-1st-work"])
def test_malformed_tags_still_name_file_and_line(tmp_path: Path, tag: str) -> None:
    path = write(tmp_path / "bad.conll", f"EU NNP B-NP B-ORG\nrejects VBZ B-VP {tag}\n")
    with pytest.raises(FormatError, match=rf"bad\.conll:2: unknown NER tag '{tag}'"):
        list(read_conll(path))


def test_a_gold_label_outside_the_taxonomy_names_itself_and_how_to_map_it(home, tmp_path: Path) -> None:
    dataset = _ingested(home, tmp_path)
    with pytest.raises(UedpError) as raised:
        detect_entities(home, dataset, DetectorConfig(detectors=["gold"]))
    message = str(raised.value)
    assert "the gold tags of dataset 'labelled': 2 labels the category taxonomy" in message
    assert "does not know: creative-work, group." in message
    assert "--label creative-work=" in message and str(home.labels_file) in message
    assert read_manifest(home.table_dir(dataset, "entities")) is None  # nothing half-written


def test_the_data_homes_labels_file_maps_and_adds_and_edits_detect_again(home, tmp_path: Path) -> None:
    dataset = _ingested(home, tmp_path)
    write(home.labels_file, "labels:\n  group: ORG\n  creative-work: WORK_OF_ART\n")
    first = detect_entities(home, dataset, DetectorConfig(detectors=["gold"]))
    assert _entities(home, dataset) >= {("Moby Dick", "WORK_OF_ART"), ("the Harbour Readers", "ORG"), ("Anna", "PERSON")}
    assert not first.reused and detect_entities(home, dataset, DetectorConfig(detectors=["gold"])).reused
    # A category of one's own, with aliases and a CoNLL class: the labels file changed, so detection runs again.
    write(home.labels_file, "labels:\n  creative-work: WORK_OF_ART\n"
                            "categories:\n  COLLECTIVE: {aliases: [group, band], coarse: ORG}\n")
    again = detect_entities(home, dataset, DetectorConfig(detectors=["gold"]))
    assert not again.reused and ("the Harbour Readers", "COLLECTIVE") in _entities(home, dataset)
    tax = taxonomy(home.labels_file)
    assert tax.resolve("band,creative-work") == ["COLLECTIVE", "WORK_OF_ART"] and tax.coarse["COLLECTIVE"] == "ORG"
    assert taxonomy(tmp_path / "elsewhere" / "labels.yaml").canonical_of("group") is None  # per data home


def test_labels_merge_over_a_custom_taxonomy_too(home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    id_line = "  ID:            {aliases: [ID, UUID], coarse: null}\n"
    custom = write(tmp_path / "categories.yaml", DEFAULT_TAXONOMY.read_text().replace(
        id_line, id_line + "  PATIENT_ID:    {aliases: [MRN], coarse: null}\n"))
    monkeypatch.setenv("UEDP_CATEGORIES", str(custom))
    write(home.labels_file, "labels:\n  chart-number: PATIENT_ID\n")
    assert taxonomy(home.labels_file).resolve("mrn,chart-number") == ["PATIENT_ID"]


@pytest.mark.parametrize(("content", "problem"), [
    ("labels: [group, ORG\n", r"cannot read the labels file .*labels\.yaml, line 2: .*not valid YAML"),
    ("labels:\n  group: [ORG]\n", r"labels\.yaml: labels entry 'group': \['ORG'\]: the category must be a name"),
    ("labels:\n  group: PII\n", r"labels\.yaml: labels entry 'group': 'PII': PII is a composite"),
    ("labels:\n  PERSON: ORG\n", r"labels entry 'PERSON': 'ORG': PERSON is a category of the taxonomy"),
    ("categories:\n  GROUP: {aliases: [ORG]}\n", r"categories entry 'GROUP': ORG is a category of the taxonomy"),
    ("categories:\n  GROUP: {synonyms: [band]}\n", r"categories entry 'GROUP': expected \{aliases:"),
    ("mappings:\n  group: ORG\n", r"labels\.yaml: unknown key 'mappings'"),
])
def test_a_malformed_labels_file_is_one_line_naming_file_and_entry(home, content: str, problem: str) -> None:
    write(home.labels_file, content)
    with pytest.raises(UedpError, match=problem) as raised:
        taxonomy(home.labels_file)
    assert "\n" not in str(raised.value)


@pytest.mark.slow
def test_cli_label_maps_adds_saves_and_later_commands_resolve_the_same_names(home, tmp_path: Path) -> None:
    files = [write(tmp_path / "tiny.train", corpus()), write(tmp_path / "tiny.testa", corpus(4)),
             write(tmp_path / "tiny.testb", corpus(4))]
    at = ["--home", str(home.root)]
    ingested = runner.invoke(app, ["ingest", "conll2003", *map(str, files), "--name", "tiny", *at])
    assert ingested.exit_code == 0, ingested.output
    refused = runner.invoke(app, ["detect", "tiny", *at])
    assert refused.exit_code == 2 and "does not know: creative-work, group" in refused.stderr and "--label" in refused.stderr

    bad = runner.invoke(app, ["detect", "tiny", "--label", "group", *at])
    assert bad.exit_code == 2
    assert bad.stderr.strip().splitlines() == [
        "error: invalid --label 'group': expected LABEL=CATEGORY, e.g. --label group=ORG (map a label onto a "
        "category) or --label TRACKING_NUMBER=TRACKING_NUMBER (add a category)"]
    assert runner.invoke(app, ["detect", "tiny", "--label", "group=", *at]).exit_code == 2
    assert not home.labels_file.exists()  # a bad option writes nothing

    detected = runner.invoke(app, ["detect", "tiny", "--label", "group=ORG", "--label", "creative-work=creative-work",
                                   "--label", "TRACKING_NUMBER=TRACKING_NUMBER", *at])
    assert detected.exit_code == 0, detected.output
    assert "group -> ORG, creative-work -> CREATIVE-WORK" in detected.stdout
    saved = home.labels_file.read_text(encoding="utf-8")
    assert "group: ORG" in saved and "creative-work: creative-work" in saved
    assert _entities(home, "tiny") >= {("Moby Dick", "CREATIVE-WORK"), ("the Harbour Readers", "ORG")}
    assert not list(home.root.glob(".labels.yaml.*"))  # written through a temporary file, replaced atomically

    counted = runner.invoke(app, ["entities", "tiny", "--categories", "creative-work,tracking_number", *at])
    assert counted.exit_code == 0, counted.output
    assert "CREATIVE-WORK" in counted.stdout
    # Training's --categories resolves with the same home's labels (the train command validates it so)
    assert TrainConfig(dataset="tiny", mechanism="noiseless", categories="creative-work,group").categories == [
        "CREATIVE-WORK", "ORG"]
    trained = runner.invoke(app, ["train", "tiny", "--mechanism", "deid", "--categories", "creative-work", "--steps", "2",
                                  "--batch-size", "4", "--threads", "1", "--seeded", *at])
    assert trained.exit_code == 0, trained.output
    # Another data home does not know them, and says how to add them.
    other = runner.invoke(app, ["entities", "tiny", "--categories", "creative-work", "--home", str(tmp_path / "other")])
    assert other.exit_code == 2 and "unknown entity categories CREATIVE-WORK" in other.stderr


def test_a_recognizer_label_outside_the_taxonomy_in_worker_processes(home, tmp_path: Path) -> None:
    import spacy

    path = write(tmp_path / "parcels.jsonl", '{"text": "Parcel 1Z999AA10123456784 reached Leeds.", "user": "u1"}\n'
                                             '{"text": "Nothing to see.", "user": "u2"}\n')
    ingest(home, "parcels", [path], IngestOptions(format="jsonl", text_col="text", user_col="user", split="users"))
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "TRACKING_NUMBER", "pattern": "1Z999AA10123456784"}])
    nlp.to_disk(tmp_path / "parcels_pipeline")
    config = DetectorConfig(detectors=["spacy"], spacy_model=str(tmp_path / "parcels_pipeline"))
    with pytest.raises(UedpError, match=r"does not know: TRACKING_NUMBER\..*--label TRACKING_NUMBER="):
        detect_entities(home, "parcels", config)
    write(home.labels_file, "labels:\n  TRACKING_NUMBER: TRACKING_NUMBER\n")
    # the worker processes get the merged taxonomy, not the packaged file alone
    detect_entities(home, "parcels", config.model_copy(update={"workers": 2}))
    assert _entities(home, "parcels") == {("1Z999AA10123456784", "TRACKING_NUMBER")}


@pytest.mark.slow
def test_a_run_with_categories_is_refused_when_the_labels_changed_after_detection(home, tmp_path: Path) -> None:
    """group=PERSON at detection, then group=ORG: a run with --categories PER would still train on the group
    entities stored as PERSON and say it protects persons' names by the new mapping. Detecting again fixes it."""
    from uedp.detection.categories import save_labels
    from uedp.services.training import train_configuration

    files = [write(tmp_path / "tiny.train", corpus()), write(tmp_path / "tiny.testa", corpus(4)),
             write(tmp_path / "tiny.testb", corpus(4))]
    at = ["--home", str(home.root)]
    assert runner.invoke(app, ["ingest", "conll2003", *map(str, files), "--name", "tiny", *at]).exit_code == 0
    assert runner.invoke(app, ["detect", "tiny", "--label", "group=PERSON", "--label", "creative-work=MISC", *at]
                         ).exit_code == 0
    tiny = dict(dataset="tiny", steps=1, batch_size=4, threads=1, checkpoint_every=0)
    deid = TrainConfig(mechanism="deid", categories="PER", **tiny)
    train_configuration(home, deid, progress=False)  # entities and labels agree
    save_labels(home.labels_file, ["group=ORG"])  # changed after detection
    with pytest.raises(UedpError, match=r"labels of this data home .* changed since the entities of 'tiny'"):
        train_configuration(home, deid, progress=False)
    train_configuration(home, TrainConfig(mechanism="noiseless", **tiny), progress=False)  # chooses no category
    assert runner.invoke(app, ["detect", "tiny", *at]).exit_code == 0  # detects again with the new mapping
    train_configuration(home, deid, progress=False)
