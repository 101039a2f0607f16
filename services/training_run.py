"""Running one set-up configuration: the mechanism trains the model (the round loop), then the model is
evaluated. Whoever watches the run (the MLflow recorder, the progress bar) is an observer: the run calls
them and knows nothing of MLflow or terminals.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from tqdm.auto import tqdm

from uedp.models.batching import Example
from uedp.models.device import training_precision
from uedp.models.metrics import (
    baseline_errors,
    bits_per_byte,
    classification_error,
    output_vocabulary_size,
    perplexity,
    predicted_bytes,
    predicted_tokens,
    uniform_perplexity,
    unigram_perplexity,
)
from uedp.privacy.mechanisms.base import RoundReport, SamplesUnits
from uedp.privacy.statement import PrivacyStatement
from uedp.progress import progress as progress_bar
from uedp.services.config import TrainConfig
from uedp.services.start_scores import start_score
from uedp.services.training_data import PreparedData
from uedp.services.training_setup import Setup, loss_function


@dataclass(frozen=True)
class RunOutcome:
    """What one run produced: the final statement (the release's and the set-up's caveats merged in), the
    held-out figures, and the epsilon of every round it reported."""

    statement: PrivacyStatement
    sampling: SamplesUnits | None  # how the rounds sampled units (the audit's participation record)
    metric: str  # "perplexity" or "error" (classification), lower is better for both
    valid: float
    test: float
    # what a model that learnt nothing scores on the test split (baselines_on), by name
    baselines: dict[str, float] = field(default_factory=dict)
    resumed_from: int = 0  # the round a resumed run restarted after (0: it started fresh)
    # A run that starts from a model: that model's figure on the same test split before any training
    # (held-out text, as the run's own); None for random weights or no test split.
    start_test: float | None = None
    # (round, epsilon) at every round reported with a finite epsilon: the run's shown rounds, each figure
    # exact, none above the final one (privacy.accounting.rounds.EpsilonSchedule)
    curve: tuple[tuple[int, float], ...] = ()
    # A language model's test and start figures in bits per byte of the text scored, where its tokenizer
    # spells bytes (models.metrics.predicted_bytes): comparable across vocabularies; None elsewhere.
    bits_per_byte_test: float | None = None
    bits_per_byte_test_start: float | None = None
    bytes_scored_test: int | None = None  # the UTF-8 bytes those figures are over (a page says how much it read)


class Observer:
    """Watches a run; every hook is optional. ``started`` gets a thunk for the validation metric before
    training (computed only if asked: a resumed run has it logged already)."""

    def started(self, initial_valid: Callable[[], float]) -> None:
        pass

    def resumed(self, after_round: int) -> None:
        pass

    def on_round(self, report: RoundReport) -> None:
        pass

    def finished(self) -> None:
        pass

    def evaluating(self, sizes: dict[str, int]) -> None:
        """The held-out splits about to be scored, by name and number of examples (minutes on a large one)."""

    def scoring_start(self, split: str, examples: int) -> None:
        """The start is about to be scored on a held-out split before training (not remembered yet)."""


class ProgressObserver(Observer):
    """A progress bar on the terminal (``enabled``), or lines to ``say`` (a Prefect flow run's log)."""

    def __init__(self, config: TrainConfig, enabled: bool, say: Callable[[str], Any] | None):
        # Federated mechanisms count rounds, the others optimizer steps: the bar says which.
        self.word = config.step_word
        self.desc, self.say, self.enabled = f"train {config.run_name()}", say, enabled
        self.bar = progress_bar(config.total_steps, self.desc, f"{self.word}s", enabled=enabled, say=say)

    def resumed(self, after_round: int) -> None:
        """Said when it happens, not only in the result: a resumed run continues its MLflow run."""
        line = f"{self.desc}: resumed from the checkpoint of {self.word} {after_round}, in the same MLflow run"
        if self.say is not None:
            self.say(line)
        else:
            tqdm.write(line, file=sys.stderr)
        self.bar.update(after_round)

    def on_round(self, report: RoundReport) -> None:
        """Epsilon is shown as the last exact figure with the round it is for (the schedule computes it at
        some rounds only: between them the bar keeps the last one, labelled, rather than a guess)."""
        if report.epsilon is None:
            pass  # between shown rounds: the bar keeps the last exact figure, labelled with its round
        elif math.isfinite(report.epsilon):
            self.bar.set_postfix(epsilon=f"{report.epsilon:.3g} after {self.word} {report.round}")
        elif math.isfinite(report.loss):
            self.bar.set_postfix(loss=f"{report.loss:.3f}")
        self.bar.update(1)

    def finished(self) -> None:
        self.bar.close()

    def evaluating(self, sizes: dict[str, int]) -> None:
        """Said before the final evaluation, which takes minutes on a large corpus and shows no bar."""
        if not sizes or not (self.enabled or self.say is not None):
            return
        self._line(f"{self.desc}: scoring the model on " + " and ".join(f"{n:,} {split} examples"
                                                                        for split, n in sizes.items()))

    def scoring_start(self, split: str, examples: int) -> None:
        """Said before the start's own figure, which takes minutes on a large model and shows no bar."""
        if self.enabled or self.say is not None:
            self._line(f"{self.desc}: scoring the start on {examples:,} {split} examples before training "
                       "(once per start and split: the next run from it reads the figure back)")

    def _line(self, line: str) -> None:
        if self.say is not None:
            self.say(line)
        else:
            print(line, file=sys.stderr, flush=True)


def run(s: Setup, observers: Sequence[Observer] = ()) -> RunOutcome:
    """Train ``s.model`` with ``s.mechanism`` (resuming from ``s.checkpoint`` when it holds a saved state),
    then evaluate it on the held-out splits. The configuration is the plan's (as it trains: sampling=planned
    gives the planner's split), read here once."""
    config = s.config
    pad_id = s.tokenizer.pad_token_id
    def start_figure(split: str, examples: Sequence[Example]) -> float:
        """The start's figure on a held-out split, before any round changes the model (remembered per start)."""
        def score() -> float:
            for observer in observers:
                observer.scoring_start(split, len(examples))
            return evaluate(s.model, examples, config, pad_id, s.device)

        return start_score(s.scores_dir, s.start, config, split, examples, pad_id, score)

    for observer in observers:
        observer.started(lambda: start_figure("valid", s.data.valid))
    curve: list[tuple[int, float]] = []
    resumed_from, first = 0, True

    def on_round(report: RoundReport) -> None:
        nonlocal resumed_from, first
        if first and report.round > 1:  # the first round after a resume
            resumed_from = report.round - 1
            for observer in observers:
                observer.resumed(resumed_from)
        first = False
        if report.epsilon is not None and math.isfinite(report.epsilon):
            curve.append((report.round, report.epsilon))
        for observer in observers:
            observer.on_round(report)

    # The start's own test figure, before any round changes it: what fine-tuning is measured against.
    start_test = start_figure("test", s.data.test) if config.starts_from_a_model and s.data.test else None
    with training_precision(config.precision):  # the forward passes of training only: evaluation stays float32
        trained = s.mechanism.train(s.model, s.data.train, loss_function(config), s.device, on_round, s.checkpoint)
    # a local-DP release's guarantee, or a synthetic corpus' generating run's, where the text is one
    statement = s.provenance.statement(trained.statement, config.mechanism) if s.provenance else trained.statement
    statement = replace(statement, caveats=(*statement.caveats, *s.caveats),
                        public=(*statement.public, *(s.start.public if s.start else ()), *s.public,
                                *(("the class label set",) if s.data.classes else ())))
    for observer in observers:
        observer.finished()
        observer.evaluating({split: len(examples) for split, examples in (("valid", s.data.valid), ("test", s.data.test))
                             if examples})
    test = evaluate(s.model, s.data.test, config, pad_id, s.device)
    tokens, n_bytes = scored_bytes(s, config)
    return RunOutcome(
        statement, trained.sampling, config.utility_metric,
        valid=evaluate(s.model, s.data.valid, config, pad_id, s.device), test=test,
        baselines=baselines_on(s.data, s.model, pad_id), resumed_from=resumed_from, start_test=start_test,
        curve=tuple(curve), bits_per_byte_test=bits_per_byte(test, tokens, n_bytes),
        bits_per_byte_test_start=bits_per_byte(start_test, tokens, n_bytes) if start_test is not None else None,
        bytes_scored_test=n_bytes)


def scored_bytes(s: Setup, config: TrainConfig) -> tuple[int, int | None]:
    """The tokens a test perplexity of this run is over, and the UTF-8 bytes they spell (None: a classifier, no
    test split, or a tokenizer that does not spell bytes), so the figure also reads in bits per byte."""
    sequences = _sequences(s.data.test)
    if config.task == "classification" or not sequences:
        return 0, None
    return predicted_tokens(sequences), predicted_bytes(s.tokenizer, sequences)


def evaluate(model: torch.nn.Module, examples: Sequence[Example], config: TrainConfig, pad_id: int,
             device: torch.device) -> float:
    """Token-weighted perplexity (language models) or the error rate (classifiers) over a split."""
    if not examples:
        return math.nan
    if config.task == "classification":
        return classification_error(model, examples, pad_id, device)
    return perplexity(model, _sequences(examples), pad_id, device)


def baselines_on(data: PreparedData, model: torch.nn.Module, pad_id: int) -> dict[str, float]:
    """What a model that learnt nothing scores on the test split, by name (empty without a test split).

    Classification: always answering the majority class, and a uniform guess among the classes. Language
    models: a uniform guess over ``model``'s output vocabulary, and a unigram model fitted on the
    validation split (held-out users, never the train split: the baseline rests on no text the model
    trained on), left out when that split is empty."""
    if data.classes is not None:
        labels = [int(e[1]) for e in data.test if isinstance(e, tuple)]
        return baseline_errors(labels, len(data.classes)) if data.classes and labels else {}
    test, valid = _sequences(data.test), _sequences(data.valid)
    if not test:
        return {}
    vocab_size = output_vocabulary_size(model)
    return ({"uniform": uniform_perplexity(vocab_size)}
            | ({"unigram": unigram_perplexity(valid, test, vocab_size, pad_id)} if valid else {}))


def _sequences(examples: Sequence[Example]) -> list[torch.Tensor]:
    """A language model's examples (token-id tensors) of a split."""
    return [e for e in examples if isinstance(e, torch.Tensor)]
