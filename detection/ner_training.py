"""Train a spaCy NER from gold-tagged sentences, on CPU, without downloading anything: what
``--detector spacy`` and ``--detector presidio`` use on machines where no pretrained pipeline can be
installed. The result is an ordinary pipeline folder (``--spacy-model DIR``).

The model is spaCy's own NER (a CNN tok2vec and a transition-based parser) on a blank English pipeline;
training is plain ``nlp.update`` over shuffled minibatches, with a time budget, and the score is spaCy's
exact-span precision, recall and F1 per label on held-out sentences.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import spacy
from spacy.language import Language
from spacy.training import Example
from spacy.util import fix_random_seed, minibatch  # type: ignore[attr-defined]

# (text, [(start, end, label), ...]) with character offsets into text
GoldSentence = tuple[str, Sequence[tuple[int, int, str]]]


@dataclass(frozen=True)
class EpochReport:
    epoch: int
    loss: float
    seconds: float
    dev_f1: float | None  # exact-span F1 on the development sentences, when given


@dataclass(frozen=True)
class LabelScore:
    precision: float
    recall: float
    f1: float


@dataclass(frozen=True)
class NerTrainingResult:
    path: Path
    epochs: int
    seconds: float
    per_label: dict[str, LabelScore]
    overall: LabelScore
    reports: list[EpochReport] = field(default_factory=list)
    stopped: str = ""  # why training ended before the last epoch, or ""


def _examples(nlp: Language, sentences: Iterable[GoldSentence]) -> list[Example]:
    """spaCy examples; a gold span that does not fall on token boundaries is left out of the labels
    (spaCy marks those tokens as unknown rather than as outside an entity)."""
    out = []
    for text, spans in sentences:
        doc = nlp.make_doc(text)
        out.append(Example.from_dict(doc, {"entities": [(s, e, label) for s, e, label in spans]}))
    return out


def score(nlp: Language, examples: list[Example]) -> tuple[dict[str, LabelScore], LabelScore]:
    scores = nlp.evaluate(examples)
    per_type = scores.get("ents_per_type") or {}
    per_label = {label: LabelScore(v["p"], v["r"], v["f"]) for label, v in sorted(per_type.items())}
    return per_label, LabelScore(scores.get("ents_p") or 0.0, scores.get("ents_r") or 0.0, scores.get("ents_f") or 0.0)


def train_ner(train: Sequence[GoldSentence], evaluate_on: Sequence[GoldSentence], out: Path, *,
              dev: Sequence[GoldSentence] = (), epochs: int = 5, max_seconds: float | None = None, seed: int = 0,
              batch_size: int = 64, dropout: float = 0.2, on_epoch: Callable[[EpochReport], None] = lambda r: None,
              trained_on: dict[str, Any] | None = None,
              side_files: Mapping[str, str] | None = None) -> NerTrainingResult:
    """Train on ``train``, report each epoch (with F1 on ``dev`` when given), score on ``evaluate_on``
    and save the pipeline to ``out`` (written beside it first, then moved: never half a folder).

    ``max_seconds`` stops after the first epoch that ends past the budget. ``trained_on`` (the dataset's
    keyed id, its texts and the split) goes into the pipeline's meta.json, so coverage can tell its own
    training split from held-out text; ``side_files`` (name -> text) are saved in the folder with it (the
    keyed hashes of the sentences it learnt from, which detection checks)."""
    fix_random_seed(seed)
    nlp = spacy.blank("en")
    nlp.add_pipe("ner")
    examples = _examples(nlp, train)
    dev_examples = _examples(nlp, dev) if dev else []
    optimizer = nlp.initialize(lambda: examples)
    rng = random.Random(seed)
    started = time.perf_counter()
    reports: list[EpochReport] = []
    stopped = ""
    for epoch in range(1, epochs + 1):
        began = time.perf_counter()
        rng.shuffle(examples)
        losses: dict[str, float] = {}
        for batch in minibatch(examples, size=batch_size):  # type: ignore[no-untyped-call]
            nlp.update(batch, sgd=optimizer, drop=dropout, losses=losses)
        dev_f1 = score(nlp, dev_examples)[1].f1 if dev_examples else None
        report = EpochReport(epoch, losses.get("ner", 0.0), time.perf_counter() - began, dev_f1)
        reports.append(report)
        on_epoch(report)
        if max_seconds is not None and time.perf_counter() - started > max_seconds and epoch < epochs:
            stopped = f"stopped after epoch {epoch}: the time budget of {max_seconds:.0f} s was spent"
            break
    seconds = time.perf_counter() - started
    per_label, overall = score(nlp, _examples(nlp, evaluate_on))
    nlp.meta["name"] = out.name.replace("-", "_") or "uedp_ner"
    nlp.meta["description"] = "spaCy NER trained by `uedp ner train` on gold entity tags"
    if trained_on:
        nlp.meta["uedp_trained_on"] = dict(trained_on)
    _save(nlp, out, side_files or {})
    return NerTrainingResult(out, len(reports), seconds, per_label, overall, reports, stopped)


def check_output(out: Path) -> None:
    """Refuse to replace anything but a spaCy pipeline folder (``--out ~/models`` must not wipe it)."""
    if out.exists() and not (out.is_dir() and (out / "meta.json").is_file() and (out / "config.cfg").is_file()):
        raise ValueError(f"{out} exists and is not a spaCy pipeline folder; choose another --out")


def _save(nlp: Language, out: Path, side_files: Mapping[str, str]) -> None:
    """Written beside ``out`` under a unique name, then swapped in: a failure leaves the old pipeline."""
    import shutil
    import uuid

    check_output(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial-{uuid.uuid4().hex[:8]}")
    nlp.to_disk(partial)
    for name, text in side_files.items():
        (partial / name).write_text(text, encoding="utf-8")
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    if out.exists():
        out.rename(old)
    partial.rename(out)
    shutil.rmtree(old, ignore_errors=True)
