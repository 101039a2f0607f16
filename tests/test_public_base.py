"""Issue 48, items 2 and 3: a public vocabulary (byte-level BPE learnt from public text only) and a public
base model built once by ``uedp pretrain``, through the real CLI, the real MLflow store and real runs
(tiny sizes and a few steps on generated Reuters-21578 files; the hour-long base is never built here)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.commands import app
from uedp.models.tokenization import (
    VOCABULARY_SOURCE_FILE,
    load_tokenizer,
    save_bpe_tokenizer,
    train_bpe_tokenizer,
    vocabulary_source,
)
from uedp.services.lineage import START_LINEAGE_TAG, text_lineage
from uedp.services.pretrain import BASE_TAG, PretrainConfig, bases

from support import demo_halves, reuters_corpus

runner = CliRunner()
TEXTS = ["Cocoa prices rose 12 pct in Brazil, traders said.", "Sugar output fell in Cuba this week.",
         "The central bank said rates would stay at 7.5 pct."] * 20
VOCAB_REFUSED = "its vocabulary was learnt from the text this run protects"
LINEAGE_REFUSED = "that model's weights were trained on the text this run protects"


def test_bpe_vocabulary_encodes_any_text_splits_digits_and_records_its_source(tmp_path: Path) -> None:
    tokenizer = train_bpe_tokenizer(TEXTS, 300)
    assert len(tokenizer) <= 300 and tokenizer.eos_token == "<|endoftext|>"
    assert any(len(token) > 3 for token in tokenizer.get_vocab())  # merges were learnt from the text
    unseen = "Zoë paid 4,315 dlrs for 3 tonnes \U0001F600"
    ids = tokenizer(unseen, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == unseen  # byte-level: nothing is <unk>
    pieces = [tokenizer.decode([i]) for i in tokenizer("rose 1987", add_special_tokens=False)["input_ids"]]
    assert pieces[-4:] == ["1", "9", "8", "7"]  # no number of the source is ever a token
    folder = save_bpe_tokenizer(tokenizer, tmp_path / "bpe", {"dataset": "pub", "lineage": ["a"]})
    assert vocabulary_source(folder) == {"dataset": "pub", "lineage": ["a"]}
    assert load_tokenizer(folder)(unseen, add_special_tokens=False)["input_ids"] == ids
    assert (folder / VOCABULARY_SOURCE_FILE).is_file() and vocabulary_source(tmp_path) is None
    with pytest.raises(ValueError, match="at least 257"):
        train_bpe_tokenizer(TEXTS, 100)


def _ok(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output
    return str(result.output)


def _refused(result, message: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, result.output
    assert message in result.stderr.replace("\n", " "), result.stderr


def test_pretrain_builds_a_base_once_and_private_runs_start_from_it(home, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                   prefect_server) -> None:
    corpus = reuters_corpus(tmp_path / "reuters", articles=60)
    private, _ = demo_halves(tmp_path)
    assert _ok(runner.invoke(app, ["ingest", "conll2003", str(private), "--name", "private", "--home", str(home.root)]))
    build = ["pretrain", str(corpus[0].parent), "--size", "tiny", "--steps", "3", "--batch-size", "8",
             "--vocab-size", "300", "--eval-file", str(private), "--threads", "1", "--home", str(home.root)]
    out = _ok(runner.invoke(app, build))
    run_id = re.search(r"MLflow run: ([0-9a-f]{32})", out).group(1)  # type: ignore[union-attr]
    flags = re.search(r"uedp train DATASET (.*) \.\.\.", out).group(1).split()  # type: ignore[union-attr]
    assert "perplexity on private.conll before fine-tuning" in out
    (base,) = bases(home)
    assert base.run_id == run_id and base.held_out["private.conll"] > 1 and base.parameters > 0
    run = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(run_id)
    assert run.data.tags[BASE_TAG] == base.key and run.data.tags["uedp.mechanism"] == "noiseless"
    assert run.data.metrics["perplexity_held_out_private_conll"] == pytest.approx(base.held_out["private.conll"])
    source = vocabulary_source(base.tokenizer_folder)
    assert source is not None and source["dataset"] == "reuters21578" and source["split"] == "train"
    assert source["lineage"] == list(text_lineage(home, "reuters21578"))

    again = _ok(runner.invoke(app, build))  # the same inputs: the same base, nothing trained
    assert "(reused)" in again and run_id in again and len(bases(home)) == 1
    # a reused base is measured on an --eval-file it has not seen (the key ignores evaluation files), and keeps it
    other = tmp_path / "other.conll"
    shutil.copy(private, other)
    measured = _ok(runner.invoke(app, [*build, "--eval-file", str(other)]))
    assert "(reused)" in measured and "perplexity on other.conll before fine-tuning" in measured
    (base,) = bases(home)
    assert base.held_out["other.conll"] == pytest.approx(base.held_out["private.conll"])  # the same text
    # ... and so does the flow a deployment schedules, with the same settings from its form
    from uedp.flows.pretrain import pretrain_flow

    flowed = pretrain_flow(PretrainConfig(home=str(home.root), files=[str(corpus[0].parent)], size="tiny", steps=3,
                                          batch_size=8, vocab_size=300, eval_files=[str(private)], threads=1))
    assert flowed.reused and flowed.run_id == run_id

    # A private run starts from it with the printed flags; its start lineage is the public corpus'
    private_run = _ok(runner.invoke(app, ["train", "private", "--mechanism", "dpsgd", "--noise-multiplier", "1",
                                          "--steps", "2", "--batch-size", "8", "--threads", "1", *flags,
                                          "--home", str(home.root)]))
    started = re.findall(r"MLflow run: ([0-9a-f]{32})", private_run)[-1]
    tags = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(started).data.tags
    assert set(text_lineage(home, "reuters21578")) <= set(tags[START_LINEAGE_TAG].split(","))

    # ... but no private run on the public corpus' own text, by the vocabulary or the weights, under any name
    dpsgd = ["--mechanism", "dpsgd", "--noise-multiplier", "1", "--steps", "2", "--threads", "1",
             "--home", str(home.root)]
    _refused(runner.invoke(app, ["train", "reuters21578", *dpsgd, "--tokenizer", base.tokenizer_folder]),
             VOCAB_REFUSED)
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in corpus:
        shutil.copy(path, copy / path.name)
    assert _ok(runner.invoke(app, ["ingest", "reuters21578", *map(str, sorted(copy.iterdir())), "--name", "copy",
                                   "--home", str(home.root)]))
    _refused(runner.invoke(app, ["train", "copy", *dpsgd, "--tokenizer", base.tokenizer_folder]), VOCAB_REFUSED)
    _refused(runner.invoke(app, ["train", "copy", *dpsgd, *flags]), VOCAB_REFUSED)
    _refused(runner.invoke(app, ["train", "copy", *dpsgd, "--model", "gpt2", "--init-from", run_id]), LINEAGE_REFUSED)
    record = json.loads(next((home.root / "bases").glob("*.json")).read_text())
    assert record["run_id"] == run_id and "reused" not in record


def test_pretrain_refuses_a_missing_eval_file_before_training(home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    corpus = reuters_corpus(tmp_path / "reuters")
    result = runner.invoke(app, ["pretrain", *map(str, corpus), "--size", "tiny", "--steps", "1",
                                 "--eval-file", str(tmp_path / "eng.testb"), "--home", str(home.root)])
    _refused(result, "--eval-file")
    assert not (home.root / "datasets").exists()
