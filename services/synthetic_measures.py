"""How good a synthetic corpus is, and how much of the private text it gives away.

**Utility** (logged to the generating run): a model of the generating run's kind and start is trained
noiselessly on the synthetic corpus (an MLflow run of its own, which states the generating run's guarantee)
and scored on the source dataset's *real* test split, next to the generating model's own test perplexity.
Like every test figure, it is computed without noise on held-out writers' text, outside the guarantee.

**Fidelity** (logged to the generating run, like utility): the Fréchet distance between sentence embeddings
(all-MiniLM-L6-v2, or any encoder folder) of the corpus and of the source's real test split, beside the same
distance between the source's real valid and test splits at the same sizes (what two real samples differ
by). Held-out text again, outside the guarantee, like every test figure.

**Leakage** (to the curator only: the terminal and a JSON file in the data home's reports, never MLflow):
figures computed against the private training text, which measure the guarantee and are not covered by it
(docs/PRIVACY.md, "What no epsilon covers"):

* the share of the corpus' distinct word n-grams found in the private train split, beside the same share
  for a reference text of the same size that the model never trained on (by default the source's test
  split: held-out writers of the same corpus, whose overlap with the train split is what text of that kind
  shares anyway), and the texts that copy a training sentence whole;
* the distinct entity surfaces of the train split (every detected category) found in the corpus, beside
  those found in the reference;
* planted canaries (``--canaries``): how many appear verbatim, and their exposure (rank among every
  candidate secret) under the model trained on the corpus.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from uedp.errors import UedpError
from uedp.privacy.attacks.canaries import Canary, canary_format
from uedp.services.logged_run import load_logged_run, logged_canaries, logged_config
from uedp.services.synthetic import MIN_SHARED_WORDS, WRITER_PREFIX, generated_corpus
from uedp.services.synthetic_source import SyntheticSource
from uedp.services.tracking import RunTracker
from uedp.storage.catalog import Catalog
from uedp.storage.home import DataHome

WORD = re.compile(r"\w+|[^\w\s]")
DEFAULT_NGRAM = 5


@dataclass(frozen=True)
class UtilityFigures:
    """A model trained on the corpus, scored on the real test split, beside the generating model."""

    dataset: str
    run_id: str  # the run trained on the synthetic corpus
    perplexity_real_test: float  # that model on the source dataset's real test split
    model_perplexity_test: float  # the generating model's own test perplexity, as it logged it
    steps: int
    # The generating run's unigram baseline on the same test split (token frequencies of its validation
    # split), as it logged it: a model worse than it has not learnt which tokens are common. nan: not logged.
    unigram_test: float = math.nan

    def line(self) -> str:
        said = (f"utility of {self.dataset}: a model trained on it ({self.steps} steps, run {self.run_id}) scores "
                f"perplexity {self.perplexity_real_test:.4g} on the real test split; the generating model "
                f"{self.model_perplexity_test:.4g}")
        if math.isfinite(self.unigram_test):
            verdict = ("worse than" if self.perplexity_real_test > self.unigram_test else "better than")
            said += (f"; a unigram model {self.unigram_test:.4g} (the corpus' model is {verdict} token frequencies "
                     "alone)")
        return said


@dataclass(frozen=True)
class FidelityFigures:
    """How far the corpus' sentence embeddings lie from the real test split's, beside two real splits."""

    dataset: str
    encoder: str  # in words: which encoder embedded the texts
    texts: int  # texts per side (the smallest of the three sets, at most FIDELITY_TEXTS)
    frechet_real_test: float  # the corpus against the real test split
    frechet_real_valid: float  # the real valid split against the real test split: the floor at this size

    def line(self) -> str:
        return (f"fidelity of {self.dataset}: Fréchet distance of {self.encoder} sentence embeddings to the real test "
                f"split {self.frechet_real_test:.4g} ({self.texts} texts a side); two real splits (valid against "
                f"test) {self.frechet_real_valid:.4g}, the floor at this size (lower is closer)")


FIDELITY_TEXTS = 2000  # texts a side: the embeddings' covariance needs a few times their width (384)


def measure_fidelity(home: DataHome, dataset: str, encoder: Path, device: str = "auto") -> FidelityFigures:
    """The corpus' and the real splits' sentence embeddings compared (:func:`models.embeddings.frechet_distance`),
    logged to the generating run and kept in the measures file."""
    from uedp.models.device import resolve_device
    from uedp.models.embeddings import embed_texts, frechet_distance

    source = generated_corpus(home, dataset)
    with Catalog(home, dataset) as catalog:
        corpus = [text for split in ("train", "valid", "test") for _, _, text in catalog.sentences(split)]
    with Catalog(home, source.dataset) as catalog:
        test = [text for _, _, text in catalog.sentences("test")]
        valid = [text for _, _, text in catalog.sentences("valid")]
    size = min(len(corpus), len(test), len(valid), FIDELITY_TEXTS)
    if size < 2:
        raise UedpError(f"fidelity needs at least 2 texts in the corpus and in {source.dataset!r}'s valid and test "
                        f"splits; found {len(corpus)}, {len(valid)} and {len(test)}")
    target = resolve_device(device)
    embedded = {name: embed_texts(encoder, _same_size(texts, size), device=target)
                for name, texts in (("corpus", corpus), ("test", test), ("valid", valid))}
    figures = FidelityFigures(dataset, encoder.name if encoder.name != "model" else encoder.parent.name, size,
                              frechet_distance(embedded["corpus"], embedded["test"]),
                              frechet_distance(embedded["valid"], embedded["test"]))
    RunTracker.attach(home, source.run_id).log_metrics({
        f"synthetic.{dataset}.frechet_real_test": figures.frechet_real_test,
        f"synthetic.{dataset}.frechet_real_valid": figures.frechet_real_valid})
    keep_measures(home, source, dataset, {"fidelity": asdict(figures)})
    return figures


@dataclass(frozen=True)
class LeakageFigures:
    """What the corpus shares with the private training text, beside a reference that never trained it."""

    dataset: str
    reference: str  # in words: which text the reference figures come from
    ngram: int
    ngram_overlap: float  # share of the corpus' distinct n-grams found in the train split
    ngram_overlap_reference: float
    copied_sentences: int  # corpus texts equal to a train sentence
    copied_sentences_reference: int
    entity_surfaces: int  # distinct train-split entity surfaces found in the corpus
    entity_surfaces_reference: int
    categories: tuple[str, ...] = ()
    canaries: int = 0  # canaries the run planted (0: none)
    canaries_verbatim: int = 0
    canary_exposure_mean: float | None = None  # under the model trained on the corpus (None: not measured)

    def lines(self) -> list[str]:
        out = [f"leakage of {self.dataset} (figures against the private text, for your eyes: not logged), reference: "
               f"{self.reference}",
               f"  distinct {self.ngram}-grams found in the train split: {self.ngram_overlap:.2%} (reference "
               f"{self.ngram_overlap_reference:.2%})",
               f"  texts copying a train sentence whole: {self.copied_sentences} (reference "
               f"{self.copied_sentences_reference})",
               f"  distinct train-split entity surfaces ({','.join(self.categories) or 'every category'}) found: "
               f"{self.entity_surfaces} (reference {self.entity_surfaces_reference})"]
        if self.canaries:
            exposure = ("" if self.canary_exposure_mean is None else
                        f"; mean exposure under a model trained on the corpus {self.canary_exposure_mean:.3g}")
            out.append(f"  planted canaries found verbatim: {self.canaries_verbatim} of {self.canaries}{exposure}")
        return out


def words(text: str) -> list[str]:
    return WORD.findall(text)


def ngrams(texts: Iterable[str], n: int) -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()
    for text in texts:
        tokens = words(text)
        found.update(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))
    return found


def overlap(texts: list[str], private: set[tuple[str, ...]], n: int) -> float:
    """The share of ``texts``' distinct n-grams that ``private`` holds (0 when they have none)."""
    theirs = ngrams(texts, n)
    return len(theirs & private) / len(theirs) if theirs else 0.0


def copies(texts: list[str], sentences: set[str]) -> int:
    """How many ``texts`` of at least ``MIN_SHARED_WORDS`` words are one of ``sentences`` whole (shorter lines,
    such as a "REUTER" sign-off, are in any corpus of the kind)."""
    return sum(len(t.split()) >= MIN_SHARED_WORDS and t.strip() in sentences for t in texts)


def surfaces_found(texts: list[str], surfaces: set[tuple[str, ...]]) -> int:
    """How many distinct entity surfaces (as word tuples) occur in ``texts`` as whole words."""
    if not surfaces:
        return 0
    longest = max(len(s) for s in surfaces)
    present: set[tuple[str, ...]] = set()
    for n in range(1, longest + 1):
        present |= ngrams(texts, n) & surfaces
    return len(present)


def measure_leakage(home: DataHome, dataset: str, reference: str | None = None, n: int = DEFAULT_NGRAM,
                    utility_run: str | None = None, device_name: str = "auto") -> LeakageFigures:
    """The leakage figures of a synthetic dataset (``reference``: a dataset of public text to compare with;
    default the source's test split). Written to ``<home>/reports/<source>/synthetic-<dataset>.json``."""
    source = generated_corpus(home, dataset)
    config = logged_config(RunTracker.attach(home, source.run_id))  # its max_len, for the canaries' scores
    with Catalog(home, dataset) as catalog:
        corpus = [text for _, _, text in catalog.sentences("train") + catalog.sentences("valid")
                  + catalog.sentences("test")]
    with Catalog(home, source.dataset) as catalog:
        rows = catalog.sentences("train")
        train = [text for _, _, text in rows]
        detected = _has_entities(home, source.dataset)
        categories = sorted(catalog.entities_per_category()) if detected else []
        spans = catalog.entity_spans(categories, "train") if detected else {}
        held_out = [text for _, _, text in catalog.sentences("test")]
    text_of = {sid: text for sid, _, text in rows}
    if reference is not None:
        with Catalog(home, reference) as catalog:
            held_out = [text for split in ("train", "valid", "test") for _, _, text in catalog.sentences(split)]
        where = f"dataset {reference!r}"
    else:
        where = f"the test split of {source.dataset!r} (held-out writers; the model never trained on it)"
    sample = _same_size(held_out, len(corpus))
    private_ngrams = ngrams(train, n)
    sentences = {t.strip() for t in train}
    surfaces = {tuple(words(text_of[sid][start:end])) for sid, found in spans.items() for start, end, _, _ in found
                if words(text_of[sid][start:end])}
    canaries, verbatim, exposure_mean = _canaries(home, source, corpus, utility_run, config.max_len, device_name)
    figures = LeakageFigures(
        dataset=dataset, reference=where, ngram=n, ngram_overlap=overlap(corpus, private_ngrams, n),
        ngram_overlap_reference=overlap(sample, private_ngrams, n),
        copied_sentences=copies(corpus, sentences), copied_sentences_reference=copies(sample, sentences),
        entity_surfaces=surfaces_found(corpus, surfaces), entity_surfaces_reference=surfaces_found(sample, surfaces),
        categories=tuple(categories), canaries=canaries, canaries_verbatim=verbatim, canary_exposure_mean=exposure_mean)
    keep_measures(home, source, dataset, {"leakage": asdict(figures)})
    return figures


def measure_utility(home: DataHome, dataset: str, steps: int = 200, batch_size: int = 16, lr: float | None = None,
                    seed: int = 0, device: str = "auto", threads: int | None = None, progress: bool = False,
                    report_to: Callable[[str], Any] | None = None) -> UtilityFigures:
    """Train a model like the generating run's (kind, size, tokenizer, start, precision) noiselessly on the
    synthetic corpus, score it on the source's real test split, and log both figures to the generating run."""
    from uedp.models.batching import encode
    from uedp.models.device import resolve_device
    from uedp.models.metrics import perplexity
    from uedp.services.config import TrainConfig
    from uedp.services.launch import run_training

    source = generated_corpus(home, dataset)
    with Catalog(home, dataset) as catalog:
        if not catalog.sentences("test"):
            raise UedpError(f"{dataset!r} has no test split to train a model on it (its made-up writers all went to "
                            "train): generate more texts (--count), fewer per writer (--per-writer) or a larger "
                            "--held-out")
    origin = logged_config(RunTracker.attach(home, source.run_id))
    settings: dict[str, Any] = {
        "dataset": dataset, "model": origin.model, "model_size": origin.model_size, "tokenizer": origin.tokenizer,
        "init_from": origin.init_from, "max_len": origin.max_len, "lora_rank": origin.lora_rank,
        "lora_alpha": origin.lora_alpha, "lora_targets": origin.lora_targets, "steps": steps,
        "batch_size": batch_size, "seed": seed, "device": device, "threads": threads, "log_model": True,
        "checkpoint_every": 0, "variant": "synthetic-utility", "precision": origin.precision}
    if lr is not None:
        settings["lr"] = lr
    config = TrainConfig.for_mechanism("noiseless", **settings)
    trained = run_training(home, config, progress=progress, report_to=report_to)
    run = load_logged_run(RunTracker.attach(home, trained.run_id), resolve_device(device), "the utility measure")
    with Catalog(home, source.dataset) as catalog:
        test = [text for _, _, text in catalog.sentences("test")]
    if not test:
        raise UedpError(f"dataset {source.dataset!r} has no test sentences to score the synthetic corpus' model on")
    real = perplexity(run.model, encode(run.tokenizer, test, origin.max_len), run.tokenizer.pad_token_id,
                      next(run.model.parameters()).device)
    generating = RunTracker.attach(home, source.run_id)
    logged = generating.client.get_run(source.run_id).data.metrics
    own = logged.get("perplexity_test", math.nan)
    RunTracker.attach(home, trained.run_id).log_metrics({"perplexity_real_test": real})
    generating.log_metrics({f"synthetic.{dataset}.perplexity_real_test": real})
    generating.set_tags({f"uedp.synthetic.{dataset}.utility_run": trained.run_id})
    figures = UtilityFigures(dataset, trained.run_id, real, float(own), steps,
                             float(logged.get("perplexity_test_unigram_baseline", math.nan)))
    keep_measures(home, source, dataset, {"utility": asdict(figures)})
    return figures


def _has_entities(home: DataHome, dataset: str) -> bool:
    from uedp.storage.manifests import entities_manifest

    return entities_manifest(home, dataset) is not None


def _same_size(texts: list[str], size: int) -> list[str]:
    """The reference at the corpus' size (a fixed draw: the figures compare like with like)."""
    if len(texts) <= size:
        return texts
    chosen = np.random.default_rng(0).choice(len(texts), size=size, replace=False)
    return [texts[int(i)] for i in sorted(chosen)]


def verbatim_canaries(canaries: list[Canary], corpus: list[str]) -> int:
    """How many canaries the corpus repeats as planted: the template's words up to the secret, then the
    secret (a bare six-digit secret turns up in figures of any news text)."""
    joined = " ".join(" ".join(text.split()) for text in corpus)
    found = 0
    for canary in canaries:
        before = " ".join(canary_format(canary.format).template.split("{secret}")[0].split())
        found += f"{before} {canary.secret}".strip() in joined
    return found


def _canaries(home: DataHome, source: SyntheticSource, corpus: list[str], utility_run: str | None, max_len: int,
              device_name: str) -> tuple[int, int, float | None]:
    """How many canaries the generating run planted, how many the corpus repeats, and their mean exposure
    under the model trained on the corpus (``utility_run``), when there is one."""
    canaries = logged_canaries(RunTracker.attach(home, source.run_id))
    if not canaries:
        return 0, 0, None
    verbatim = verbatim_canaries(canaries, corpus)
    if utility_run is None:
        return len(canaries), verbatim, None
    from uedp.models.device import resolve_device
    from uedp.privacy.attacks.canaries import exposure, model_log_perplexity

    device = resolve_device(device_name)
    run = load_logged_run(RunTracker.attach(home, utility_run), device, "the canary exposure")
    score = model_log_perplexity(run.model, run.tokenizer, device, max_len)
    return len(canaries), verbatim, float(np.mean([exposure(c, score).exposure for c in canaries]))


def keep_measures(home: DataHome, source: SyntheticSource, dataset: str, figures: dict[str, Any]) -> Path:
    """Merge ``figures`` into the corpus' measures file in the data home (the curator's; never released)."""
    folder = home.reports_dir(source.dataset)
    folder.mkdir(parents=True, exist_ok=True)
    file = measures_file(home, source.dataset, dataset)
    kept = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    kept |= figures
    temporary = file.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(kept, indent=1), encoding="utf-8")
    temporary.replace(file)
    return file


def measures_file(home: DataHome, source_dataset: str, dataset: str) -> Path:
    """The curator's measures of synthetic corpus ``dataset``: ``<home>/reports/<source>/synthetic-<name>.json``,
    the name once (a default name, ``synthetic-<run>``, is not written twice)."""
    name = dataset if dataset.startswith(WRITER_PREFIX) else f"{WRITER_PREFIX}{dataset}"
    return home.reports_dir(source_dataset) / f"{name}.json"
