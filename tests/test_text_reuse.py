"""Issue 62, items 1, 2, 6 and 7: the private text reaching a run by routes a whole-text lineage missed: a
search whose trials started from a model that saw it, a tokenizer taken from such a model's folder, a NER
fitted to a superset of the dataset, and copies of the train split (alone, or half its documents) used as a
public start or charged to another budget.

Real runs through the real CLI (tiny GPT-2s, the real MLflow store), on the bundled demo corpus cut into a
"private" half and a "pub" half. The halves are written from the same templates by other writers: they
share 38% of the smaller half's distinctive sentences, and pub must still pass as public text. Every test
here failed on main before the fix (21ae03f).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.commands import app
from uedp.services.lineage import text_lineage
from uedp.services.ner import train_dataset_ner
from uedp.services.pretrain import public_tokenizer
from uedp.services.text_overlap import shares_train_text
from uedp.services.tuned import read_record
from uedp.storage.catalog import Catalog
from uedp.storage.home import DataHome
from uedp.storage.ingest import IngestOptions, ingest

from support import demo_halves, reuters_corpus, write

runner = CliRunner()
SMALL = ["--steps", "2", "--batch-size", "8", "--threads", "1", "--checkpoint-every", "0"]
DPSGD = ["--mechanism", "dpsgd", "--noise-multiplier", "1"]
START_REFUSED = "that model's weights were trained on the text this run protects"
VOCAB_REFUSED = "its vocabulary was learnt from the text this run protects"
SEARCH_REFUSED = "or its trials started from a model or a vocabulary that saw it"


def cli(home: DataHome, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [*args, "--home", str(home.root)])


def train(home: DataHome, dataset: str, *args: str):  # type: ignore[no-untyped-def]
    return cli(home, "train", dataset, *SMALL, *args)


def run_id(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output + (result.stderr or "")
    found = re.findall(r"MLflow run: ([0-9a-f]{32})", result.output)
    assert found, result.output
    return found[-1]


def refused(result, message: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, result.output
    assert message in result.stderr.replace("\n", " "), result.stderr


def documents(path: Path) -> list[str]:
    """A CoNLL file's documents, each with its -DOCSTART- line."""
    return ["-DOCSTART-" + d for d in path.read_text(encoding="utf-8").split("-DOCSTART-") if d.strip()]


def train_split_copy(home: DataHome, dataset: str, out: Path) -> Path:
    """The dataset's train split alone, as JSON lines (its writers kept): all the text its runs protect."""
    with Catalog(home, dataset) as catalog:
        rows = [{"text": text, "user": user} for _, user, text in catalog.sentences("train")]
    return write(out, "".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[DataHome, Path]:
    """One data home for the module: private and pub ingested, and a noiseless run on pub (a public start)."""
    root = tmp_path_factory.mktemp("reuse")
    home = DataHome.from_env(root / "home")
    private, public = demo_halves(root)
    ingest(home, "private", [private], IngestOptions(format="conll2003"))
    ingest(home, "pub", [public], IngestOptions(format="conll2003", split="users", split_seed=1))
    return home, root


@pytest.fixture(scope="module")
def pub_run(corpus: tuple[DataHome, Path]) -> str:
    home, _ = corpus
    return run_id(train(home, "pub", "--mechanism", "noiseless", "--log-model"))


@pytest.fixture(scope="module")
def news_run(corpus: tuple[DataHome, Path]) -> str:
    """A run on a third, public text (generated Reuters-21578 files): a start for a search on pub."""
    home, root = corpus
    ingest(home, "news", reuters_corpus(root / "news"), IngestOptions(format="reuters21578"))
    return run_id(train(home, "news", "--mechanism", "noiseless", "--log-model"))


def test_copies_of_part_of_the_train_split_are_its_text_and_a_template_sharing_corpus_is_not(
        corpus: tuple[DataHome, Path], pub_run: str) -> None:
    """Item 7: a copy of the private train split alone, and of half its documents, are other whole texts (on
    main a model trained on them without noise was accepted as a public start); pub, which shares template
    sentences with private, still starts a private run."""
    home, root = corpus
    half = documents(root / "private.conll")
    ingest(home, "half", [write(root / "half.conll", "".join(half[:len(half) // 2]))], IngestOptions(format="conll2003", split="users", test_fraction=0.3))
    ingest(home, "train_copy", [train_split_copy(home, "private", root / "train_copy.jsonl")],
           IngestOptions(format="jsonl", text_col="text", user_col="user", split="users", test_fraction=0.3))
    for copy in ("half", "train_copy"):
        assert not set(text_lineage(home, copy)) & set(text_lineage(home, "private"))  # another whole text
        assert shares_train_text(home, "private", text_lineage(home, copy))
        on_copy = run_id(train(home, copy, "--mechanism", "noiseless", "--log-model"))
        refused(train(home, "private", *DPSGD, "--init-from", on_copy), START_REFUSED)

    assert not shares_train_text(home, "private", text_lineage(home, "pub"))
    started = train(home, "private", *DPSGD, "--init-from", pub_run)
    assert f"run {pub_run} (noiseless on dataset 'pub'" in started.output, started.output + (started.stderr or "")


def test_a_search_whose_trials_saw_the_private_text_is_refused_and_a_public_one_names_its_start(
        corpus: tuple[DataHome, Path], news_run: str) -> None:
    """Item 1: on main `uedp tune pub --init-from R0` (R0 trained on private) recorded pub's text only, and
    `--tuned` then stated the values were chosen on public text."""
    home, _ = corpus
    r0 = run_id(train(home, "private", "--mechanism", "noiseless", "--log-model"))
    search = ["tune", "pub", *DPSGD, *SMALL, "--grid", "lr=1e-3,1e-2"]
    out = cli(home, *search, "--init-from", r0)
    assert out.exit_code == 0, out.output + (out.stderr or "")
    key = re.findall(r"--tuned (\w+)", out.output)[-1]
    record = read_record(home, key)
    assert record is not None and set(text_lineage(home, "private")) <= set(record.lineage)
    assert any(f"run {r0}" in start for start in record.start)
    refused(train(home, "private", *DPSGD, "--tuned", key), SEARCH_REFUSED)

    public = cli(home, *search, "--init-from", news_run)
    assert public.exit_code == 0, public.output + (public.stderr or "")
    key = re.findall(r"--tuned (\w+)", public.output)[-1]
    trained = run_id(train(home, "private", *DPSGD, "--tuned", key))
    stated = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(trained).data.params["privacy_public"]
    assert f"chosen by uedp tune {key}" in stated and f"the trials started from the initial model: run {news_run}" in stated


def test_a_tokenizer_from_a_runs_model_folder_is_checked_as_that_run_and_named_in_the_statement(
        corpus: tuple[DataHome, Path]) -> None:
    """Item 2: a vocabulary learnt from private is refused for dpsgd on private; on main the same merges,
    written into a noiseless run's model folder, were accepted from that folder."""
    home, root = corpus
    learnt = public_tokenizer(home, "private", 300, say=lambda _: None)
    refused(train(home, "private", *DPSGD, "--tokenizer", str(learnt)), VOCAB_REFUSED)
    ran = run_id(train(home, "private", "--mechanism", "noiseless", "--tokenizer", str(learnt), "--log-model"))
    folder = Path(MlflowClient(tracking_uri=home.mlflow_tracking_uri).download_artifacts(ran, "model",
                                                                                      str(root / "download")))
    assert not (folder / "vocabulary_source.json").exists()  # the route: nothing of pretrain's record came along
    refused(train(home, "private", *DPSGD, "--tokenizer", str(folder)), VOCAB_REFUSED)
    # the tokenizer's files alone, copied out of the model folder: known by this home's record of each
    alone = root / "tokenizer-alone"
    alone.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / name, alone / name)
    refused(train(home, "private", *DPSGD, "--tokenizer", str(alone)), VOCAB_REFUSED)

    # a vocabulary learnt from public text trains, and the statement names it
    public = public_tokenizer(home, "pub", 300, say=lambda _: None)
    trained = run_id(train(home, "private", *DPSGD, "--tokenizer", str(public)))
    stated = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(trained).data.params["privacy_public"]
    assert f"the tokenizer: folder {public.resolve()}, learnt from dataset 'pub'" in stated


def test_a_ner_fitted_to_a_superset_of_the_dataset_may_not_detect_it(corpus: tuple[DataHome, Path]) -> None:
    """Item 6: private plus one more document, ingested as private_plus; on main a NER fitted to it detected
    private (its text key is not private's, so the sentence comparison never ran)."""
    home, root = corpus
    plus = write(root / "private_plus.conll", (root / "private.conll").read_text(encoding="utf-8")
                 + documents(root / "public.conll")[0])
    ingest(home, "private_plus", [plus], IngestOptions(format="conll2003"))
    fitted = train_dataset_ner(home, "private_plus", root / "ner-plus", epochs=1, max_minutes=None).path
    detected = cli(home, "detect", "private", "--detector", "spacy", "--spacy-model", str(fitted))
    refused(detected, "it was fitted to text that shares the sentences of the train split of 'private'")
    assert not (home.table_dir("private", "entities") / "data.parquet").exists()  # nothing written


def test_a_copy_of_the_train_split_is_charged_to_the_private_texts_budget(tmp_path: Path) -> None:
    """Item 7: on main a private run on a copy of the train split went to no budget of the private text."""
    home = DataHome.from_env(tmp_path / "home")
    private, _ = demo_halves(tmp_path)
    ingest(home, "private", [private], IngestOptions(format="conll2003"))
    ingest(home, "train_copy", [train_split_copy(home, "private", tmp_path / "copy.jsonl")],
           IngestOptions(format="jsonl", text_col="text", user_col="user", split="users", test_fraction=0.3))
    first = run_id(train(home, "train_copy", *DPSGD))
    spent = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(first).data.metrics["final_epsilon"]
    assert cli(home, "budget", "private", "--limit", f"{1.5 * spent:.6g}").exit_code == 0
    budget = cli(home, "budget", "private")
    assert "train_copy" in budget.output, budget.output  # the copy's release is listed with the private text's
    refused(train(home, "private", *DPSGD), "past its budget")


def test_a_damaged_lineage_record_is_named_not_a_traceback(corpus: tuple[DataHome, Path], pub_run: str) -> None:
    """A record of a logged model's files that cannot be read says which file, and is not taken as 'unknown'."""
    home, _ = corpus
    record = next(p for p in home.model_lineage_dir.glob("*.json"))
    kept = record.read_text(encoding="utf-8")
    record.write_text("{not json", encoding="utf-8")
    try:
        from uedp.errors import UedpError
        from uedp.services.lineage import _recorded

        with pytest.raises(UedpError, match=f"{record.name}: not a uedp lineage record"):
            _recorded(home, "sha256:" + record.stem)
    finally:
        record.write_text(kept, encoding="utf-8")
