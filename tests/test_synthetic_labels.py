"""Labelled synthetic corpora (issue 66 item 2): a language model trained with control codes reads each
sentence after its class' code; ``uedp generate --labels`` samples each text after a code in shares the user
gives (never counted from the data: the corpus' class counts do not move with the private class counts), and
keeps the class in the label column; ``--measure`` trains a classifier on the corpus and on the real train
split, both scored on the real test split.

Real parts: an AG News file in the distribution's CSV format ingested to Parquet, a Presidio digit policy run
by the detect flow, tiny GPT-2s and BERTs trained by the real CLI into a real MLflow store."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from uedp.commands import app
from uedp.services.control_codes import code_length, control_code, with_code, without_code
from uedp.services.synthetic import GenerateConfig
from uedp.storage.home import DataHome
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.tables import read_table

from support import run_id_printed

runner = CliRunner()
SMALL = ["--threads", "1", "--checkpoint-every", "0", "--log-model"]
TOPICS = {"1": ("talks", "minister", "border", "election"), "2": ("match", "coach", "season", "goal"),
          "3": ("shares", "profit", "market", "bank"), "4": ("software", "probe", "chip", "lab")}


def _ag_csv(path: Path, per_class: dict[str, int], seed: int) -> Path:
    """AG News' CSV layout (class, title, description), news agencies as writers, one number in each item."""
    lines = []
    for label, count in per_class.items():
        words = TOPICS[label]
        for i in range(count):
            agency = ("Reuters", "AP", "AFP")[(i + seed) % 3]
            lines.append(f'"{label}","{words[i % 4].title()} report {i}","{agency} - The {words[(i + 1) % 4]} and the '
                         f'{words[(i + 2) % 4]} moved {10 + i + seed} times this week."')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def cli(home: DataHome, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [*args, "--home", str(home.root)])


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory, prefect_server) -> tuple[DataHome, str, str]:  # type: ignore[no-untyped-def]
    """A skewed labelled corpus (class 3 nine times as common as class 2), its digits detected by a Presidio
    policy, and a noiseless GPT-2 trained on it with control codes and one without, both logged. The commands
    share the session's Prefect server (each would otherwise start its own)."""
    folder = tmp_path_factory.mktemp("labelled")
    home = DataHome.from_env(folder / "home")
    train = _ag_csv(folder / "train.csv", {"1": 12, "2": 4, "3": 36, "4": 12}, seed=0)
    test = _ag_csv(folder / "test.csv", {"1": 4, "2": 4, "3": 4, "4": 4}, seed=1)
    ingest(home, "news", [train, test], IngestOptions(format="ag_news", users="source"))
    import spacy

    policy = Path(__file__).resolve().parents[1] / "experiments" / "digit_policy.yaml"
    blank = folder / "spacy-blank-en"
    spacy.blank("en").to_disk(blank)  # Presidio tokenizes with it; the digit policy's regex needs no NER model
    detected = cli(home, "detect", "news", "--detector", "presidio", "--spacy-model", str(blank), "--recognizers",
                   str(policy), "--no-default-recognizers", "--presidio-entities", "CARDINAL")
    assert detected.exit_code == 0, detected.output
    coded = run_id_printed(cli(home, "train", "news", "--mechanism", "noiseless", "--steps", "4", "--control-codes", *SMALL))
    plain = run_id_printed(cli(home, "train", "news", "--mechanism", "noiseless", "--steps", "2", *SMALL))
    return home, coded, plain


def test_a_code_starts_the_sentence_and_comes_off_a_generated_text() -> None:
    assert control_code("3") == "[3]" and with_code("3", "Shares rose.") == "[3] Shares rose."
    assert code_length("3") == len("[3] ")
    assert without_code("3", "[3] Shares rose.") == "Shares rose." and without_code("3", "Shares.") == "Shares."


def test_the_class_counts_are_the_settings_alone_and_interleaved_by_the_seed() -> None:
    config = GenerateConfig(run_id="0" * 32, count=10, labels=["1", "2", "3"])
    labels = config.text_labels()
    assert Counter(labels) == {"1": 4, "2": 3, "3": 3} or Counter(labels) == {"1": 3, "2": 4, "3": 3} or \
        Counter(labels) == {"1": 3, "2": 3, "3": 4}
    assert sum(Counter(labels).values()) == 10 and labels != sorted(labels)  # interleaved, not in blocks
    assert labels == config.text_labels()  # a function of the settings: the same every time
    shared = GenerateConfig(run_id="0" * 32, count=8, labels=["a", "b", "c"], label_shares=[2, 1, 1]).text_labels()
    assert Counter(shared) == {"a": 4, "b": 2, "c": 2}
    assert GenerateConfig(run_id="0" * 32, count=3).text_labels() == [None, None, None]
    for bad, said in (({"labels": ["a"], "label_shares": [1, 2]}, "2 shares for 1 labels"),
                      ({"labels": ["a", "b"], "label_shares": [1, 0]}, "every share must be positive"),
                      ({"labels": ["a", "a"]}, "a class is named twice")):
        with pytest.raises(ValueError, match=said):
            GenerateConfig(run_id="0" * 32, **bad)  # type: ignore[arg-type]


def test_training_reads_each_sentence_after_its_code_with_its_private_spans_moved(labelled) -> None:  # type: ignore[no-untyped-def]
    from uedp.services.config import TrainConfig
    from uedp.services.training_data import load_training_texts
    from uedp.storage.catalog import Catalog

    home, _, _ = labelled
    config = TrainConfig(dataset="news", mechanism="selective", noise_multiplier=1.0, control_codes=True,
                         categories=["CARDINAL"])
    with Catalog(home, "news") as catalog:
        training = load_training_texts(catalog, config)
        classes = catalog.labels("train")
    texts = [t for user in training.texts.values() for t in user]
    assert len(texts) == len(classes) == 64 and all(re.match(r"^\[[1-4]\] ", t) for t in texts)
    assert training.labels is None  # a language model: the class is text, not a target
    for user, spans in training.spans.items():
        for text, marked in zip(training.texts[user], spans):
            assert marked and all(text[s:e].isdigit() for s, e in marked)  # each number, where it is now
    with pytest.raises(ValueError, match="a classifier reads it as its label already"):
        TrainConfig(dataset="news", mechanism="noiseless", model="bert", control_codes=True)


def test_a_labelled_corpus_keeps_the_classes_in_the_shares_given_and_says_they_are_public(labelled) -> None:  # type: ignore[no-untyped-def]
    home, coded, plain = labelled
    made = cli(home, "generate", coded, "--count", "12", "--max-new-tokens", "6", "--per-writer", "3",
               "--labels", "2,3", "--output", "synth-labelled")
    assert made.exit_code == 0, made.output
    assert "the classes generated and their shares: 2 0.5, 3 0.5 (given by the user, read from no data)" in made.output
    table = read_table(home.table_dir("synth-labelled", "sentences"))
    labels, texts = table["label"].to_pylist(), table["text"].to_pylist()
    # equal shares, though class 3 is nine times class 2 in the private text: no count of it reaches the corpus
    assert Counter(labels) == {"2": 6, "3": 6}
    assert not any(t.startswith(("[2]", "[3]")) for t in texts)  # the code came off; the class is the label
    refused = cli(home, "generate", plain, "--count", "4", "--labels", "1,2", "--output", "synth-refused")
    assert refused.exit_code == 2 and "was not trained with control codes" in refused.stderr
    unlabelled = cli(home, "generate", coded, "--count", "4", "--max-new-tokens", "4", "--output", "synth-plain")
    assert unlabelled.exit_code == 0 and set(read_table(home.table_dir("synth-plain", "sentences"))["label"]
                                             .to_pylist()) == {None}


def test_accuracy_of_a_classifier_trained_on_the_corpus_beside_one_trained_on_real_text(labelled) -> None:  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    from uedp.services.synthetic_accuracy import measure_accuracy

    home, coded, _ = labelled
    made = cli(home, "generate", coded, "--count", "24", "--max-new-tokens", "8", "--per-writer", "2",
               "--labels", "1,2,3,4", "--output", "synth-measured")
    assert made.exit_code == 0, made.output
    figures = measure_accuracy(home, "synth-measured", steps=3, device="cpu", threads=1)
    assert 0 <= figures.accuracy_real_test <= 1 and 0 <= figures.real_accuracy_real_test <= 1
    assert figures.run_id != figures.real_run_id
    logged = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(coded).data
    assert logged.metrics["synthetic.synth-measured.accuracy_real_test"] == pytest.approx(figures.accuracy_real_test)
    assert f"right on {figures.accuracy_real_test:.1%} of the real test split" in figures.line()
    # the real-train classifier's figure is its own logged test error: the same as scoring it like the corpus' one
    import torch

    from uedp.services.synthetic_accuracy import _error_on, _real_test

    rescored = 1.0 - _error_on(home, figures.real_run_id, _real_test(home, "news"), torch.device("cpu"))
    assert figures.real_accuracy_real_test == pytest.approx(rescored)
    again = measure_accuracy(home, "synth-measured", steps=3, device="cpu", threads=1)
    assert again.real_run_id == figures.real_run_id  # trained once per source, then found again
