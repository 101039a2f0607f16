"""What a new user met on real corpora (issue 50), each as the command that showed it: half-written
datasets, labels reported one per run, defaults that disagreed, warnings easy to miss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from uedp.cli import app
from uedp.errors import UedpError
from uedp.storage.formats import FormatError
from uedp.storage.ingest import IngestOptions, ingest

from support import write

runner = CliRunner()


# --- a failed ingest leaves nothing that is listed as a dataset --------------------------------------------


def test_a_failed_first_ingest_leaves_no_dataset_behind(home, tmp_path: Path) -> None:
    good = write(tmp_path / "train.jsonl", "".join(json.dumps({"text": f"Note {i}.", "user": f"u{i % 3}"}) + "\n"
                                                   for i in range(6)))
    broken = write(tmp_path / "test.jsonl", good.read_text() + '{"text": "cut\n')
    options = IngestOptions(format="jsonl", text_col="text", user_col="user")
    with pytest.raises(FormatError, match=r"test\.jsonl:7: invalid JSON"):
        ingest(home, "notes", [good, broken], options)
    assert not home.dataset_dir("notes").exists()
    listing = runner.invoke(app, ["datasets", "--home", str(home.root)])
    assert listing.exit_code == 0 and "notes" not in listing.output and "no datasets under" in listing.output

    ingest(home, "notes", [good], options)  # a dataset that exists keeps its tables when a later ingest fails
    with pytest.raises(FormatError):
        ingest(home, "notes", [good, broken], options)
    assert "notes: sentences=6 users=3" in runner.invoke(app, ["datasets", "--home", str(home.root)]).output


def test_a_folder_a_killed_ingest_left_is_named_with_how_to_remove_it(home) -> None:
    left = home.dataset_dir("secraw")
    (left / ".sentences.tmp-1-abcdef12").mkdir(parents=True)  # what a kill -9 mid-ingest leaves
    result = runner.invoke(app, ["datasets", "--home", str(home.root)])
    assert result.exit_code == 0
    assert "secraw:" not in result.stdout and "no datasets under" in result.stdout
    assert f"not a dataset: {left} holds no complete sentences table" in result.stderr
    assert f"rm -r {left}" in result.stderr


# --- every unknown label of a corpus at once ---------------------------------------------------------------

# WNUT-17 style: CoNLL columns, tag types of its own (hyphenated), invented text.
WNUT = """-DOCSTART- -X- -X- O

Orchard NNP B-NP B-corporation
staff NN I-NP O
met VBD B-VP O
the DT B-NP O
Harbour NNP I-NP B-group
Singers NNP I-NP I-group
in IN B-PP O
Cardiff NNP B-NP B-location
. . O O

Kestrel NNP B-NP B-product
Phone NNP I-NP I-product
plays VBZ B-VP O
Sea NNP B-NP B-creative-work
Song NNP I-NP I-creative-work
. . O O
"""


def test_detect_lists_every_unknown_label_of_the_corpus_at_once(home, tmp_path: Path) -> None:
    from uedp.detection.categories import save_labels
    from uedp.detection.pipeline import DetectorConfig
    from uedp.services.detect import detect_entities

    ingest(home, "wnut", [write(tmp_path / "wnut.train", WNUT)], IngestOptions(format="conll2003"))
    gold = DetectorConfig(detectors=["gold"])
    with pytest.raises(UedpError) as caught:
        detect_entities(home, "wnut", gold)
    message = str(caught.value)
    # One error names all three (location and product are names the taxonomy knows), with one command for all.
    assert "the gold tags of dataset 'wnut': 3 labels the category taxonomy" in message
    assert "does not know: corporation, creative-work, group." in message
    assert ("uedp detect wnut --label corporation=CATEGORY --label creative-work=CATEGORY --label group=CATEGORY,"
            in message)
    assert "--label creative-work=ORG (map it onto a category) or --label creative-work=CREATIVE-WORK" in message
    assert not home.table_dir("wnut", "entities").exists()

    save_labels(home.labels_file, ["corporation=ORG", "group=ORG", "creative-work=WORK_OF_ART"])
    assert detect_entities(home, "wnut", gold).entities == 5  # the same corpus, once every label is said


# --- one default set of categories, and a word when a mechanism ignores the ones given -----------------------


@pytest.fixture
def demo_home(home):
    from uedp.detection.pipeline import DetectorConfig
    from uedp.services.detect import detect_entities
    from uedp.storage.ingest import conll_options

    from support import REPO

    ingest(home, "demo", [REPO / "uedp" / "data" / "demo.conll"], conll_options(split_seed=0))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    return home


def test_entities_and_train_default_to_the_same_categories(demo_home) -> None:
    from uedp.services.config import TrainConfig

    trained_default = TrainConfig(dataset="demo", mechanism="uedp").categories
    shown = runner.invoke(app, ["entities", "demo", "--home", str(demo_home.root)])
    assert shown.exit_code == 0, shown.output
    assert f"categories: {','.join(trained_default)} (the default of uedp train and uedp entities" in shown.stdout
    rows = {line.split("│")[1].strip() for line in shown.stdout.splitlines() if line.count("│") >= 4}
    assert {"ORG", "LOC", "PERSON"} <= rows  # ORG was missing: entities defaulted to PII
    assert "ORG" in trained_default
    import typer

    option = next(p for p in typer.main.get_command(app).commands["entities"].params if p.name == "categories")
    assert f"sensitive, {','.join(trained_default)})" in option.help


def test_train_says_when_a_mechanism_ignores_the_categories_given(demo_home) -> None:
    common = ["--home", str(demo_home.root), "--seeded", "--threads", "1", "--noise-multiplier", "1"]  # no calibration
    userdp = runner.invoke(app, ["train", "demo", "--mechanism", "userdp", "--categories", "PERSON", "--rounds", "2",
                                 *common])
    assert userdp.exit_code == 0, userdp.output
    assert ("warning: userdp ignores --categories PERSON: it trains the same whatever entities a sentence names "
            "(its unit: one user (all of their sentences)") in userdp.stderr
    from uedp.commands.training import ignored_categories
    from uedp.services.config import TrainConfig

    assert ignored_categories(TrainConfig(dataset="demo", mechanism="uedp-bounded", categories="PERSON"), "PERSON") is None
    assert ignored_categories(TrainConfig(dataset="demo", mechanism="userdp"), None) is None  # nothing given
    logged = TrainConfig(dataset="demo", mechanism="userdp")  # a logged configuration fed back holds the default
    assert ignored_categories(logged, logged.categories) is None
    said = ignored_categories(TrainConfig(dataset="demo", mechanism="noiseless", categories="PERSON,LOC"),
                              ["PERSON", "LOC"])
    assert said is not None and said.startswith("noiseless ignores --categories PERSON,LOC") and "(no privacy unit;" in said


def test_a_uedp_bounded_run_that_drops_the_entity_text_warns_before_training(demo_home) -> None:
    from uedp.services.config import TrainConfig
    from uedp.services.training import train_configuration

    config = TrainConfig(dataset="demo", mechanism="uedp-bounded", holders_per_entity=0, rounds=1, q_user=0.5,
                         noise_multiplier=1.0, checkpoint_every=0, threads=1, randomness="seeded")
    said: list[str] = []
    train_configuration(demo_home, config, progress=False, report_to=said.append)
    warned = [line for line in said if line.startswith(f"warning: {config.run_name()}: uedp-bounded (k = 0) trains on 0 of")]
    assert len(warned) == 1, said
    assert "the model learns no entity text. Trade-off: a larger --holders-per-entity" in warned[0]
    assert said.index(warned[0]) < next(i for i, line in enumerate(said) if ": torch: " in line), said  # before training


# --- attack figures, each beside its own chance level --------------------------------------------------------


def test_each_canary_figure_has_its_own_chance_level_as_random_ranks_give_it() -> None:
    import numpy as np

    from uedp.privacy.attacks.canaries import chance_exposure

    rng = np.random.default_rng(0)
    size, trials = 1_000_000, 20_000
    for n in (1, 8, 32):
        ranks = rng.integers(1, size + 1, size=(trials, n))  # a model that learnt nothing: uniform ranks
        exposures = np.log2(size) - np.log2(ranks)
        chance = chance_exposure(n)
        assert exposures.mean() == pytest.approx(chance["canary_exposure_mean"], rel=0.03)
        assert exposures.max(axis=1).mean() == pytest.approx(chance["canary_exposure_max"], rel=0.03)
        assert exposures.min(axis=1).mean() == pytest.approx(chance["canary_exposure_min"], rel=0.06)
    assert chance_exposure(8)["canary_exposure_max"] == pytest.approx(3.92, abs=0.01)  # the issue's ~3.9


def test_the_attack_summary_gives_each_figure_its_baseline_and_flags_an_interval_below_chance() -> None:
    from uedp.services.attack import AttackOutcome, below_chance, summary_rows

    metrics = {"canary_exposure_mean": 1.5, "canary_exposure_max": 3.7, "canary_count": 8.0,
               "mia_entity_auc": 0.43, "mia_entity_auc_low": 0.39, "mia_entity_auc_high": 0.46,
               "mia_user_auc": 0.48, "mia_user_auc_low": 0.41, "mia_user_auc_high": 0.55}
    rows = {row[1]: row for row in summary_rows(AttackOutcome(metrics, accounted_epsilon=8.0, delta=1e-5))}
    assert rows["canary_exposure_max"][3] == "~3.92 (the best of 8 random ranks)"
    assert rows["canary_exposure_mean"][3] == "~1.44 (random ranks)"
    assert rows["mia_entity_auc"][2].endswith("below chance: see the note")
    assert "below chance" not in rows["mia_user_auc"][2]  # its interval holds 0.5
    (note,) = below_chance(metrics)
    assert note.startswith("mia_entity_auc 0.43 (95% CI 0.39-0.46) is below chance (0.5) with its whole interval")
