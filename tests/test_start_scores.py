"""A start's held-out figure is remembered under the content key of everything it is a function of, and only
there (services/start_scores.py): a changed split, start, adaptation or scoring code is scored afresh, a
classifier (whose head is drawn per run) never reads one back, and a damaged entry is scored again.
tests/test_checkpoint_models.py checks the same through `uedp train` on a checkpoint folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from uedp.services import start_scores
from uedp.services.config import TrainConfig
from uedp.services.initial_model import Start
from uedp.services.start_scores import remembers, score_key, start_score

START = Start("folder", Path("folder"), "causal-lm", content_hash="a" * 64)
CONFIG = TrainConfig(dataset="d", mechanism="noiseless")
EXAMPLES = [torch.tensor([1, 5, 9, 2]), torch.tensor([1, 7, 2])]


class Scorer:
    """Counts how often the figure is actually computed."""

    def __init__(self, value: float) -> None:
        self.value, self.calls = value, 0

    def __call__(self) -> float:
        self.calls += 1
        return self.value


def test_a_figure_is_scored_once_and_read_back(tmp_path: Path) -> None:
    scorer = Scorer(41.5)
    assert start_score(tmp_path, START, CONFIG, "test", EXAMPLES, 0, scorer) == 41.5
    assert start_score(tmp_path, START, CONFIG, "test", EXAMPLES, 0, Scorer(99.0)) == 41.5
    assert scorer.calls == 1 and len(list(tmp_path.glob("*.json"))) == 1
    assert not list(tmp_path.glob(".*tmp*"))  # written whole


def test_each_input_of_the_figure_is_in_its_key() -> None:
    base = score_key(START, CONFIG, "test", EXAMPLES, 0)
    assert score_key(START, CONFIG, "test", [t.clone() for t in EXAMPLES], 0) == base  # content, not identity
    others = {
        "split": score_key(START, CONFIG, "valid", EXAMPLES, 0),
        "one token": score_key(START, CONFIG, "test", [EXAMPLES[0], torch.tensor([1, 7, 3])], 0),
        "order": score_key(START, CONFIG, "test", EXAMPLES[::-1], 0),
        "cut between examples": score_key(START, CONFIG, "test", [torch.tensor([1, 5]), torch.tensor([9, 2, 1, 7, 2])], 0),
        "start": score_key(Start("folder", Path("folder"), "causal-lm", content_hash="b" * 64), CONFIG, "test",
                           EXAMPLES, 0),
        "lora rank": score_key(START, CONFIG.model_copy(update={"lora_rank": 4}), "test", EXAMPLES, 0),
        "padding id": score_key(START, CONFIG, "test", EXAMPLES, 3),
    }
    assert base not in others.values() and len(set(others.values())) == len(others)


def test_a_change_to_the_scoring_code_scores_afresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    start_score(tmp_path, START, CONFIG, "test", EXAMPLES, 0, Scorer(41.5))
    monkeypatch.setattr(start_scores, "_code_identity", lambda: "another version of models/metrics.py")
    scorer = Scorer(40.0)
    assert start_score(tmp_path, START, CONFIG, "test", EXAMPLES, 0, scorer) == 40.0 and scorer.calls == 1


def test_what_is_not_a_function_of_the_start_alone_is_never_remembered(tmp_path: Path) -> None:
    classifier = TrainConfig(dataset="d", mechanism="noiseless", model="bert")
    assert classifier.task == "classification"
    unhashed = Start("gpt2", None, "", content_hash="")
    assert remembers(START, CONFIG)
    assert not remembers(START, classifier) and not remembers(unhashed, CONFIG) and not remembers(None, CONFIG)
    for start, config in ((START, classifier), (unhashed, CONFIG), (None, CONFIG)):
        scorer = Scorer(7.0)
        start_score(tmp_path, start, config, "test", EXAMPLES, 0, scorer)
        start_score(tmp_path, start, config, "test", EXAMPLES, 0, scorer)
        assert scorer.calls == 2
    assert not list(tmp_path.iterdir())
    scorer = Scorer(7.0)
    start_score(None, START, CONFIG, "test", EXAMPLES, 0, scorer)  # no folder: nothing to remember in
    assert scorer.calls == 1


def test_a_damaged_entry_is_scored_again_and_rewritten(tmp_path: Path) -> None:
    start_score(tmp_path, START, CONFIG, "test", EXAMPLES, 0, Scorer(41.5))
    (entry,) = tmp_path.glob("*.json")
    entry.write_text('{"value": ', encoding="utf-8")  # cut short
    scorer = Scorer(41.5)
    assert start_score(tmp_path, START, CONFIG, "test", EXAMPLES, 0, scorer) == 41.5 and scorer.calls == 1
    assert json.loads(entry.read_text(encoding="utf-8"))["value"] == 41.5


def test_an_infinite_figure_reads_back_as_infinite(tmp_path: Path) -> None:
    start_score(tmp_path, START, CONFIG, "test", EXAMPLES, 0, Scorer(float("inf")))
    assert start_score(tmp_path, START, CONFIG, "test", EXAMPLES, 0, Scorer(1.0)) == float("inf")


def test_the_code_identity_covers_the_scoring_functions_and_only_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from uedp.models import metrics
    from uedp.services import training_run

    assert training_run.perplexity is metrics.perplexity  # what a run's figure is computed by is in SCORING
    assert metrics.perplexity in start_scores.SCORING and metrics.sequence_nll not in start_scores.SCORING
    before = start_scores._code_identity()
    assert start_scores._code_identity() == before
    monkeypatch.setattr(start_scores, "SCORING", (*start_scores.SCORING[:-1], -99))  # another padding label
    assert start_scores._code_identity() != before
