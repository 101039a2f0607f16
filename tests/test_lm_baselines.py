"""A language model's perplexity beside what a model that learnt nothing scores: a uniform guess over its
output vocabulary, and a unigram fitted on the validation split; computed, printed by `uedp train`, logged to
MLflow, read back by `uedp report`, and a warning where a run learnt nothing."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from transformers.modeling_outputs import CausalLMOutput
from typer.testing import CliRunner

from uedp.cli import app
from uedp.commands.tables import print_summary
from uedp.flows.demo import DEMO_CORPUS
from uedp.models.batching import encode
from uedp.models.factory import build_model
from uedp.models.lora import LoraSettings, with_lora
from uedp.models.metrics import output_vocabulary_size, perplexity, uniform_perplexity, unigram_perplexity
from uedp.services.training import TrainResult
from uedp.storage.catalog import Catalog
from uedp.storage.ingest import IngestOptions, ingest

from support import TOKENIZER

runner = CliRunner()
CPU = torch.device("cpu")


class FixedUnigramLM(torch.nn.Module):
    """A language model that ignores the context: every position predicts the same log-probabilities."""

    def __init__(self, log_probabilities: torch.Tensor):
        super().__init__()
        self.log_probabilities = log_probabilities

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> CausalLMOutput:
        return CausalLMOutput(logits=self.log_probabilities.expand(*input_ids.shape, -1))


def _ids(*rows: list[int]) -> list[torch.Tensor]:
    return [torch.tensor(row, dtype=torch.long) for row in rows]


def test_uniform_perplexity_is_the_vocabulary_size() -> None:
    assert uniform_perplexity(257) == 257.0
    with pytest.raises(ValueError):
        uniform_perplexity(0)


def test_unigram_perplexity_matches_a_hand_computation() -> None:
    # Fitted targets (each sequence's first token is not predicted): 1, 1 and 0, so with add-one smoothing
    # over 4 tokens p = (2, 3, 1, 1) / 7. Scored targets: 1 and 3 (the pad id is a real token inside a
    # sequence, as EOS is for the byte-level tokenizer), then 2; the one-token sequence and the padding of
    # the shorter rows count for nothing.
    fit, scored = _ids([0, 1, 1], [2, 0]), _ids([0, 1, 3], [2, 2], [1])
    by_hand = math.exp(-(math.log(3 / 7) + math.log(1 / 7) + math.log(1 / 7)) / 3)
    assert unigram_perplexity(fit, scored, vocab_size=4, pad_id=3) == pytest.approx(by_hand, rel=1e-12)
    # Fitted on nothing, add-one smoothing leaves the uniform guess.
    assert unigram_perplexity([], scored, vocab_size=4, pad_id=3) == pytest.approx(4.0, rel=1e-12)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        unigram_perplexity(fit, _ids([0, 4]), vocab_size=4, pad_id=3)
    with pytest.raises(ValueError, match="empty split"):
        unigram_perplexity(fit, _ids([1]), vocab_size=4, pad_id=3)


def test_unigram_counts_the_tokens_that_perplexity_counts() -> None:
    """A context-free model holding the unigram's probabilities has exactly the unigram's perplexity under
    ``perplexity()``: both score the same targets, padding and first tokens left out alike."""
    fit = encode(TOKENIZER, ["Anna Berg lives in Leeds.", "The clinic opens at nine.", "ok"], 32)
    scored = encode(TOKENIZER, ["A much longer sentence about the harbour in Leeds.", "x", "Nine o'clock."], 64)
    vocab, pad = len(TOKENIZER), TOKENIZER.pad_token_id
    counts = torch.zeros(vocab, dtype=torch.float64)
    for sequence in fit:
        for token in sequence[1:].tolist():  # brute force: every token after the first
            counts[token] += 1
    model = FixedUnigramLM(((counts + 1) / (counts.sum() + vocab)).log().float())
    assert unigram_perplexity(fit, scored, vocab, pad) == pytest.approx(perplexity(model, scored, pad, CPU, 2), rel=1e-5)


def test_the_output_vocabulary_is_read_from_every_kind_of_language_model() -> None:
    vocab = len(TOKENIZER)
    for kind in ("gpt2", "llama", "lstm"):
        assert output_vocabulary_size(build_model(kind, "tiny", TOKENIZER)) == vocab, kind
    adapted = with_lora(build_model("llama", "tiny", TOKENIZER), LoraSettings(rank=2, alpha=4.0))
    assert output_vocabulary_size(adapted) == vocab


def _train(home_root: Path, *args: str) -> tuple[str, str, str]:
    """`uedp train` a noiseless tiny GPT-2 on the demo corpus: (run id, stdout, stderr)."""
    result = runner.invoke(app, ["train", "demo", "--home", str(home_root), "--mechanism", "noiseless", "--seeded",
                                 *args])
    assert result.exit_code == 0, result.output
    return result.stdout.split("MLflow run: ")[1].split()[0], result.stdout, result.stderr


def test_train_prints_logs_and_reports_the_baselines_and_warns_when_nothing_was_learnt(home) -> None:
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    client = MlflowClient(tracking_uri=home.mlflow_tracking_uri)
    learnt, stdout, stderr = _train(home.root, "--steps", "120", "--lr", "3e-3")
    line = re.search(r"baselines on the test split: uniform guess perplexity 257, unigram \(fitted on the "
                     r"validation split\) perplexity ([\d.]+); ", stdout)
    assert line is not None, stdout
    metrics = client.get_run(learnt).data.metrics
    assert metrics["perplexity_test_uniform_baseline"] == 257.0
    # The unigram is fitted on the validation split (never the train split) and scored on the test split.
    with Catalog(home, "demo") as catalog:
        valid, test = ([text for _, _, text in catalog.sentences(split)] for split in ("valid", "test"))
    unigram = unigram_perplexity(encode(TOKENIZER, valid, 96), encode(TOKENIZER, test, 96), 257, TOKENIZER.pad_token_id)
    assert metrics["perplexity_test_unigram_baseline"] == pytest.approx(unigram, rel=1e-9)
    assert float(line.group(1)) == pytest.approx(unigram, rel=1e-3)
    assert metrics["perplexity_test"] < unigram and "warning" not in stderr  # it learnt more than frequencies

    # One step at a huge learning rate destroys the model: no better than a uniform guess.
    destroyed, _, stderr = _train(home.root, "--steps", "1", "--lr", "1")
    assert client.get_run(destroyed).data.metrics["perplexity_test"] >= 257
    assert re.search(r"warning: noiseless-steps1-s0 is no better than a uniform guess \(test perplexity \S+ >= 257\): it has "
                     r"learnt nothing", stderr), stderr
    # A few small steps learn something, but not yet which tokens are common.
    early, _, stderr = _train(home.root, "--steps", "3", "--lr", "3e-3")
    assert unigram < client.get_run(early).data.metrics["perplexity_test"] < 257
    assert "worse than a unigram model fitted on the validation split" in stderr
    assert "uniform guess" not in stderr

    rebuilt = runner.invoke(app, ["report", "demo", "--home", str(home.root), "--runs", learnt])
    assert rebuilt.exit_code == 0, rebuilt.output
    markdown = Path(rebuilt.stdout.split("report of 1 runs: ")[1].split()[0]).read_text(encoding="utf-8")
    assert (f"Baselines on the test split: a uniform guess gives perplexity 257; a unigram model (token frequencies) "
            f"fitted on the validation split gives {unigram:.4g}.") in markdown


def test_the_summary_warns_for_each_run_no_better_than_its_baselines(capsys: pytest.CaptureFixture[str]) -> None:
    def result(mechanism: str, test: float) -> TrainResult:
        return TrainResult(run_id=mechanism, mechanism=mechanism, categories=["PER"], epsilon=math.inf, delta=0.0,
                           noise_multiplier=0.0, utility_metric="perplexity", utility_valid=test, utility_test=test,
                           rounds=1, baselines={"uniform": 257.0, "unigram": 27.5})

    print_summary([result("noiseless", 20.0), result("dpsgd", 300.0), result("userdp", 40.0)])
    out, err = capsys.readouterr()
    assert "uniform guess perplexity 257, unigram (fitted on the validation split) perplexity 27.5" in out
    assert "warning: dpsgd (categories PER) is no better than a uniform guess (test perplexity 300 >= 257)" in err
    assert "warning: userdp (categories PER) is worse than a unigram model" in err and "noiseless" not in err
