"""A labelled synthetic corpus measured as the anchors measure one (Yue et al. 2023): a classifier trained
noiselessly on the corpus, scored on the source's *real* test split, beside the same classifier trained on the
real train split (the figure the corpus stands in for).

The corpus' classifier is post-processing of the generating run's model, so it states that run's guarantee.
The real-train classifier is a noiseless run on the private text, with no guarantee: it is a reference for the
curator, trained and logged like any noiseless run (and charged as one). Test figures on held-out real text are
outside every epsilon, as any run's test figure is (docs/PRIVACY.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from uedp.errors import UedpError
from uedp.services.logged_run import load_logged_run, logged_config
from uedp.services.synthetic import generated_corpus
from uedp.services.tracking import RunTracker
from uedp.storage.catalog import Catalog
from uedp.storage.home import DataHome

CLASSIFIER = {"model": "bert", "model_size": "tiny"}  # small enough to train in minutes on a CPU


@dataclass(frozen=True)
class AccuracyFigures:
    """The corpus' classifier and the real-train classifier, both scored on the source's real test split."""

    dataset: str
    run_id: str  # the classifier trained on the synthetic corpus
    real_run_id: str  # the same classifier trained on the source's real train split (no guarantee)
    accuracy_real_test: float  # the corpus' classifier on the real test split
    real_accuracy_real_test: float  # the real-train classifier on the same split
    steps: int

    def line(self) -> str:
        gap = 100 * (self.real_accuracy_real_test - self.accuracy_real_test)
        return (f"accuracy of {self.dataset}: a classifier trained on it ({self.steps} steps, run {self.run_id}) is "
                f"right on {self.accuracy_real_test:.1%} of the real test split; trained on the real train split "
                f"(run {self.real_run_id}, no guarantee) {self.real_accuracy_real_test:.1%} ({gap:+.1f} points)")


def is_labelled(home: DataHome, dataset: str) -> bool:
    with Catalog(home, dataset) as catalog:
        return bool(catalog.labels("train"))


def measure_accuracy(home: DataHome, dataset: str, steps: int = 200, batch_size: int = 16, seed: int = 0,
                     device: str = "auto", threads: int | None = None, progress: bool = False,
                     report_to: Any = None) -> AccuracyFigures:
    """Train the classifier on the corpus and on the source's real train split, score both on the real test
    split, log the corpus' figure to its own run and to the generating run, and keep both with the measures."""
    from uedp.models.device import resolve_device
    from uedp.services.config import TrainConfig
    from uedp.services.finished_runs import finished_result
    from uedp.services.launch import run_training
    from uedp.services.synthetic_measures import keep_measures

    source = generated_corpus(home, dataset)
    if not is_labelled(home, dataset):
        raise UedpError(f"{dataset!r} has no labels: accuracy is measured on a labelled corpus (generate with --labels)")
    origin = logged_config(RunTracker.attach(home, source.run_id))
    settings: dict[str, Any] = {**CLASSIFIER, "tokenizer": origin.tokenizer, "max_len": origin.max_len, "steps": steps,
                                "batch_size": batch_size, "seed": seed, "device": device, "threads": threads,
                                "log_model": True, "checkpoint_every": 0}
    on_corpus = TrainConfig.for_mechanism("noiseless", **settings, dataset=dataset, variant="synthetic-accuracy")
    on_real = TrainConfig.for_mechanism("noiseless", **settings, dataset=source.dataset, variant="real-accuracy")
    corpus_run = run_training(home, on_corpus, progress=progress, report_to=report_to)
    # The real-train classifier is the same for every corpus of this source: trained once, then found again. Its
    # own test split is the real test split, scored as below, so its logged error is the figure.
    real_run = finished_result(home, on_real) or run_training(home, on_real, progress=progress, report_to=report_to)
    runs = {dataset: corpus_run.run_id, source.dataset: real_run.run_id}
    accuracy = {dataset: 1.0 - _error_on(home, corpus_run.run_id, _real_test(home, source.dataset),
                                         resolve_device(device)),
                source.dataset: 1.0 - real_run.utility_test}
    RunTracker.attach(home, runs[dataset]).log_metrics({"accuracy_real_test": accuracy[dataset]})
    generating = RunTracker.attach(home, source.run_id)
    generating.log_metrics({f"synthetic.{dataset}.accuracy_real_test": accuracy[dataset]})
    generating.set_tags({f"uedp.synthetic.{dataset}.accuracy_run": runs[dataset]})
    figures = AccuracyFigures(dataset, runs[dataset], runs[source.dataset], accuracy[dataset], accuracy[source.dataset],
                              steps)
    keep_measures(home, source, dataset, {"accuracy": asdict(figures)})
    return figures


def _real_test(home: DataHome, dataset: str) -> list[tuple[str, str]]:
    with Catalog(home, dataset) as catalog:
        labels = catalog.labels("test")
        test = [(text, labels[sid]) for sid, _, text in catalog.sentences("test") if sid in labels]
    if not test:
        raise UedpError(f"dataset {dataset!r} has no labelled test sentences to score the classifiers on")
    return test


def _error_on(home: DataHome, run_id: str, test: list[tuple[str, str]], device: Any) -> float:
    """The run's classifier's error on ``test`` (text, class): a class it never saw in training is an error."""
    from uedp.models.batching import encode
    from uedp.models.metrics import classification_error
    from uedp.services.training_data import class_names

    run = load_logged_run(RunTracker.attach(home, run_id), device, "the accuracy measure", task="classification")
    with Catalog(home, run.config.dataset) as catalog:
        classes = class_names({"all": list(catalog.labels("train").values())})
    index = {name: i for i, name in enumerate(classes)}
    known = [(text, index[label]) for text, label in test if label in index]
    if not known:
        return 1.0
    ids = encode(run.tokenizer, [text for text, _ in known], run.config.max_len)
    error = classification_error(run.model, list(zip(ids, [i for _, i in known])), run.tokenizer.pad_token_id, device)
    wrong = error * len(known) + (len(test) - len(known))
    return wrong / len(test) if test else math.nan
