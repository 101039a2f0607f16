"""Detection false positives nobody flagged (issue 37, item 3): after `uedp detect` the curator sees the
entities held by the most users with their share, and a warning for one held by too many (a greeting tagged
PERSON in every dialog, <unk> as ORG); `--ignore-entities FILE` drops listed surfaces (part of the detection
cache key, stated in every entity-level run's caveats); `uedp entities --coverage` says which split each
figure is measured on, marking a `uedp ner train` NER's own training split. Real ingest, detection, Parquet,
DuckDB, CLI and spaCy training."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import spacy
from typer.testing import CliRunner

from uedp.commands import app
from uedp.detection.categories import taxonomy
from uedp.detection.pipeline import DetectorConfig
from uedp.services.config import TrainConfig
from uedp.services.coverage import coverage_by_split, detector_recall
from uedp.services.detect import MIN_HOLDERS_TO_WARN, SHARED_ENTITY_WARNING, detect_entities, entity_checks
from uedp.services.ner import train_dataset_ner
from uedp.services.training_setup import coverage_caveats
from uedp.storage.catalog import Catalog
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.tables import read_manifest

from support import write

runner = CliRunner()
USERS = 12  # documents per split file: one document is one user


def _document(split: str, user: int) -> list[str]:
    """A dialog opening with "Hello" (tagged PERSON, as a CoNLL-trained NER does), a name of its own, and
    Leeds (LOC) in every other document."""
    name = f"Name{split}{user}"
    lines = ["-DOCSTART- -X- -X- O", "", "Hello UH O B-PER", ", , O O", f"{name} NNP I-NP B-PER", "wrote VBD O O",
             ". . O O", ""]
    if user % 2 == 0:
        lines += ["They PRP O O", "met VBD O O", "in IN O O", "Leeds NNP I-NP B-LOC", ". . O O", ""]
    return lines


def _corpus(folder: Path) -> list[Path]:
    return [write(folder / f"dialogs.{split}", "\n".join(line for user in range(USERS) for line in _document(split, user))
                  + "\n") for split in ("train", "testa", "testb")]


@pytest.fixture
def dialogs(home, tmp_path: Path) -> str:  # type: ignore[no-untyped-def]
    ingest(home, "dialogs", _corpus(tmp_path / "corpus"), IngestOptions(format="conll2003"))
    return "dialogs"


def _detect(home, dataset: str, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["detect", dataset, "--home", str(home.root), *args])


def _surfaces(home, dataset: str) -> set[tuple[str, str]]:  # type: ignore[no-untyped-def]
    with Catalog(home, dataset) as catalog:
        return set(catalog.con.execute("SELECT DISTINCT category, text FROM entities").fetchall())


def test_detect_lists_the_entities_most_users_hold_and_warns_about_a_greeting_tagged_in_every_dialog(
        home, dialogs: str, prefect_server: None) -> None:  # type: ignore[no-untyped-def]
    result = _detect(home, dialogs)
    assert result.exit_code == 0, result.output
    # The listing: category, surface, users holding it, share of the dataset's users (36: 12 per split).
    assert re.search(r"PERSON\s+│\s+Hello\s+│\s+36 of 36\s+│\s+100\.0%", result.stdout), result.stdout
    assert re.search(r"LOC\s+│\s+Leeds\s+│\s+18 of 36\s+│\s+50\.0%", result.stdout), result.stdout
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, result.stderr  # Hello (100%) and Leeds (50%), never the names held by one user
    hello = next(w for w in warnings if "'Hello'" in w)
    assert "36 of 36 users (100%)" in hello and "false positive" in hello and "--ignore-entities FILE" in hello
    assert "PERSON: Hello" in hello  # the line to put in the file
    # The same listing again without detecting again.
    again = runner.invoke(app, ["entities", dialogs, "--home", str(home.root), "--common"])
    assert again.exit_code == 0, again.output
    assert re.search(r"PERSON\s+│\s+Hello\s+│\s+36 of 36\s+│\s+100\.0%", again.stdout)
    assert "'Hello' is held by 36 of 36 users (100%)" in again.stderr
    # Entity text is for this terminal only: not in the flow's result, nor in the table's manifest.
    manifest = (home.table_dir(dialogs, "entities") / "manifest.json").read_text()
    assert "Hello" not in manifest and "Leeds" not in manifest
    plain = runner.invoke(app, ["entities", dialogs, "--home", str(home.root)])
    assert plain.exit_code == 0 and "Hello" not in plain.output  # without --common: counts only


def test_the_warning_threshold_leaves_real_gold_entities_alone(home, dialogs: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    detect_entities(home, dialogs, DetectorConfig())
    checks = entity_checks(home, dialogs)
    assert checks is not None
    assert [(e.surface, e.users, e.of_users) for e in checks.widespread] == [("Hello", 36, 36), ("Leeds", 18, 36)]
    assert checks.common[0].share == 1.0 and len(checks.common) == 10  # the ten held by the most users
    # Few users: an entity two of four hold is half of them, and no warning (too few holders to tell).
    few = [write(tmp_path / "few" / f"few.{split}", "\n".join(
        line for user in range(2) for line in _document(split, user)) + "\n") for split in ("train", "testa")]
    ingest(home, "few", few, IngestOptions(format="conll2003"))
    detect_entities(home, "few", DetectorConfig())
    small = entity_checks(home, "few")
    assert small is not None and small.common[0].users == 4 < MIN_HOLDERS_TO_WARN and not small.widespread
    # Between the largest share of a real gold entity in CoNLL-2003 (12.3%) and a false positive's (80%+).
    assert 0.13 < SHARED_ENTITY_WARNING < 0.8


@pytest.mark.slow
def test_real_conll_gold_entities_raise_no_warning(home, shared_conll: Path) -> None:  # type: ignore[no-untyped-def]
    ingest(home, "conll", sorted(shared_conll.glob("eng.*")), IngestOptions(format="conll2003"))
    detect_entities(home, "conll", DetectorConfig())
    checks = entity_checks(home, "conll")
    assert checks is not None and not checks.widespread
    top = checks.common[0]
    assert (top.category, top.surface, top.of_users) == ("LOC", "U.S.", 1393) and top.share < SHARED_ENTITY_WARNING / 2


def test_ignore_entities_drops_the_listed_surfaces_is_in_the_cache_key_and_in_the_caveats(
        home, dialogs: str, tmp_path: Path, prefect_server: None) -> None:  # type: ignore[no-untyped-def]
    first = _detect(home, dialogs)
    assert first.exit_code == 0, first.output
    plain_key = read_manifest(home.table_dir(dialogs, "entities"))["key"]  # type: ignore[index]
    ignore = write(tmp_path / "ignore.txt", "# greetings tagged as people\n\nhello\n")
    result = _detect(home, dialogs, "--ignore-entities", str(ignore))
    assert result.exit_code == 0, result.output
    assert "wrote" in result.stdout and "'Hello'" not in result.stderr  # matched case-insensitively
    surfaces = _surfaces(home, dialogs)
    assert ("PERSON", "Hello") not in surfaces and ("PERSON", "Nametrain3") in surfaces and ("LOC", "Leeds") in surfaces
    manifest = read_manifest(home.table_dir(dialogs, "entities"))
    assert manifest is not None and manifest["key"] != plain_key and manifest["ignored_surfaces"] == 1
    # The same rules again: reused; edited rules: detected again. A category limits a line to that category.
    assert "reused" in _detect(home, dialogs, "--ignore-entities", str(ignore)).stdout
    write(ignore, "hello\nPERSON: Leeds\nPER: nametrain3\n")
    edited = _detect(home, dialogs, "--ignore-entities", str(ignore))
    assert edited.exit_code == 0 and "wrote" in edited.stdout, edited.output
    surfaces = _surfaces(home, dialogs)
    assert ("LOC", "Leeds") in surfaces and ("PERSON", "Nametrain3") not in surfaces  # PER is PERSON's alias
    # Every entity-level private run says how many listed surfaces it does not protect (never which).
    with Catalog(home, dialogs) as catalog:
        recall = detector_recall(catalog, ["PERSON", "LOC"])
    caveats = coverage_caveats(TrainConfig(dataset=dialogs, mechanism="uedp"), recall)
    assert "3 surfaces listed in --ignore-entities are not protected as entities" in " | ".join(caveats)
    assert not any("Hello" in c or "hello" in c or "Leeds" in c for c in caveats)
    assert not any("ignore" in c for c in coverage_caveats(TrainConfig(dataset=dialogs, mechanism="noiseless"), None))
    # Without the file: the table of every detection again.
    assert _detect(home, dialogs).exit_code == 0
    assert read_manifest(home.table_dir(dialogs, "entities"))["key"] == plain_key  # type: ignore[index]
    with Catalog(home, dialogs) as catalog:
        assert detector_recall(catalog, ["PERSON"]).ignored_surfaces == 0


def test_a_missing_file_or_a_malformed_line_is_one_error_naming_it(home, dialogs: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "nowhere.txt"
    result = _detect(home, dialogs, "--ignore-entities", str(missing))
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert "nowhere.txt" in result.stderr and "cannot read" in result.stderr
    typo = write(tmp_path / "typo.txt", "# ok\nHello\nPERSN: Anna\n")
    result = _detect(home, dialogs, "--ignore-entities", str(typo))
    assert result.exit_code == 2 and "typo.txt, line 3" in result.stderr and "PERSN" in result.stderr, result.output
    empty = write(tmp_path / "empty.txt", "LOC:\n")
    result = _detect(home, dialogs, "--ignore-entities", str(empty))
    assert result.exit_code == 2 and "empty.txt, line 1" in result.stderr, result.output
    assert read_manifest(home.table_dir(dialogs, "entities")) is None  # refused before any work


def _ruler(path: Path) -> Path:
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "GPE", "pattern": "Leeds"}])
    nlp.to_disk(path)
    return path


def test_coverage_names_the_split_of_every_figure_and_marks_the_ners_own_training_split(
        home, dialogs: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A NER of this dataset learns from its held-out valid split (one fitted to its train split may not detect it)
    ner = train_dataset_ner(home, dialogs, tmp_path / "ner", epochs=1, max_minutes=None, train_split="valid",
                            dev_split="")
    detect_entities(home, dialogs, DetectorConfig(detectors=["gold", "spacy"], spacy_model=str(ner.path)))
    rows = coverage_by_split(home, dialogs)
    splits = {(row.split, row.own_training_split) for row in rows}
    assert splits == {("train", False), ("valid", True), ("test", False), ("valid+test", True)}
    with Catalog(home, dialogs) as catalog:  # the recall an epsilon states: on test alone, which it never saw
        recall = detector_recall(catalog, ["PERSON", "LOC"])
        test_only = [r for r in catalog.coverage(["spacy"], taxonomy().coarse, splits=("test",),
                                                 predicted_categories=["PERSON", "LOC"]) if r[0] in ("LOC", "PER")]
    assert recall.value == pytest.approx(sum(round(r[6] * r[1]) for r in test_only) / sum(r[1] for r in test_only))
    result = runner.invoke(app, ["entities", dialogs, "--home", str(home.root), "--coverage"])
    assert result.exit_code == 0, result.output
    table = [line for line in result.stdout.splitlines() if line.startswith("│ spacy")]
    assert table and all(re.search(r"│ (train|valid \(NER's training split\)|test \(held-out\)|"
                                   r"valid\+test \(NER's training(?: split\))?) +│ (LOC|PER) ", line) for line in table), \
        result.stdout
    assert {"train", "valid", "test", "valid+test"} <= {line.split("│")[2].split()[0] for line in table}
    assert "figures on the NER's own training split overstate it" in result.stdout
    # A pipeline `uedp ner train` did not make: no split is called its training split.
    detect_entities(home, dialogs, DetectorConfig(detectors=["gold", "spacy"], spacy_model=str(_ruler(tmp_path / "r"))))
    rows = coverage_by_split(home, dialogs)
    assert rows and not any(row.own_training_split for row in rows)
    assert {row.split_label for row in rows} == {"train", "valid (held-out)", "test (held-out)",
                                                  "valid+test (held-out)"}
    # The NER on another dataset's text: it learnt none of it, so none of its splits is its training split.
    from uedp.flows.demo import DEMO_CORPUS

    ingest(home, "other", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "other", DetectorConfig(detectors=["gold", "spacy"], spacy_model=str(ner.path)))
    rows = coverage_by_split(home, "other")
    assert rows and not any(row.own_training_split for row in rows)


def test_an_ignore_line_may_name_a_hyphenated_category_that_a_label_added(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--label creative-work=creative-work` adds CREATIVE-WORK; `CREATIVE-WORK: Moby Dick` must drop it there,
    not be read as the surface "CREATIVE-WORK: Moby Dick" that drops nothing."""
    from uedp.detection.categories import save_labels
    from uedp.detection.pipeline import read_ignore_list

    labels = tmp_path / "labels.yaml"
    save_labels(labels, ["creative-work=creative-work"])
    monkeypatch.setenv("UEDP_LABELS", str(labels))
    rules = read_ignore_list(write(tmp_path / "ignore.txt", "CREATIVE-WORK: Moby Dick\n")).rules
    assert rules == frozenset({("CREATIVE-WORK", "moby dick")})
