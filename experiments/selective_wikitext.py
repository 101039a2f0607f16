"""``selective-wikitext``: the Selective-DP paper's Table 2 (left) on WikiText-2: a one-layer word-level
LSTM trained noiseless, with DP-SGD and with Selective-DPSGD (the recurrent form) at about the same
epsilon, every digit private (the paper's policy), and the canary "My ID is 341752" planted ten times
(Fig. 3b), plus the paper's section 5.4.2: a secret the policy misses, under selective and under data
anonymization (``deid``, digits redacted).

What this page builds for itself, from public text only:

* the digit policy: a Presidio recognizer file (``digit_policy.yaml`` beside this module) run by
  ``detect_flow`` over a blank spaCy pipeline, every run of digits a CARDINAL entity;
* a word-level tokenizer (:func:`uedp.models.tokenization.word_level_tokenizer`) whose vocabulary is the
  most frequent words of WikiText-2's *validation* file, which no run trains on (the models are judged on
  the test file): a vocabulary learned from the training text would publish its words outside every
  epsilon. Digits are always the single-digit tokens 0-9, so the vocabulary holds no number.

The marked canary is written into the (copied) training file itself, so the digit policy finds it like
any other number; the missed secrets are uedp's planted canaries (``--canaries``), which no detector
marks, in the phone format so that they do not share the marked canary's template.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from uedp.errors import UedpError
from uedp.experiments.claims import Claim, Verdict, clearly_above, exposure_unmeasurable, judge
from uedp.experiments.common import Context, Results
from uedp.experiments.corpora import blank_pipeline, corpus_folder, write_if_changed
from uedp.experiments.page import Page, budget_at, markdown_table, number, verdict_table
from uedp.experiments.runs import canary_figures, measured_once, run_sweep
from uedp.experiments.starts import (
    BASES,
    Start,
    labelled,
    prepare_start,
    record_start,
    recorded_start,
    split_by_start,
    start_paragraph,
)

POLICY = Path(__file__).with_name("digit_policy.yaml")
CATEGORY = "CARDINAL"  # the taxonomy's numeral category: what the digit policy emits
SPLIT_FILES = {"train": ("train.txt", "wiki.train.tokens"), "valid": ("valid.txt", "wiki.valid.tokens"),
               "test": ("test.txt", "wiki.test.tokens")}
TRAIN_ARTICLES = 600  # WikiText-2's training file (Merity et al. 2017)
# The paper's canary (section 5.1.1), planted ten times; as uedp's ``digits:6`` format writes it.
CANARY_SECRET = 341752
CANARY_TEXT = f"My ID is {CANARY_SECRET} ."
CANARY_REPEATS = 10
MISSED_FORMAT = "phone"  # "Call me on 555-NNNN .": unmarked, exact rank over 10^4 candidates
PAPER_DELTA = 8e-5
PAPER_EPSILON = 4.9  # DPSGD 4.89, S-DPSGD 4.91 (Table 2)
PAPER_PRIVATE_SHARE = 0.028  # of WikiText-2's tokens (section 5.3)
# The paper's Table 2 (left) and Fig. 3b, from its text.
PAPER_TABLE2 = [("LSTM, No-DP", "60.98 ± 0.48", "0.36", "-", "-", "-", "up to ~20"),
                ("DPSGD", "305.86 ± 3.00", "0.27", "0.50", "0.10", "4.89", "low"),
                ("S-DPSGD", "160.04 ± 4.86", "0.31", "0.50", "1e-3", "4.91", "low")]
ORDER = {"noiseless": 0, "deid": 1, "dpsgd": 2, "selective": 3}


@dataclass(frozen=True)
class Settings:
    articles: int | None  # the first training articles (users) used; None: all 600
    eval_articles: int | None  # the first articles of the valid and test files; None: all
    vocabulary: int  # words taken from the validation file (plus <unk>, EOS and the ten digits)
    steps: int
    batch_size: int
    lr: float
    seeds: tuple[int, ...]
    canaries: int  # missed secrets (planted by uedp, unmarked), each planted canary_repeats times
    canary_repeats: int
    lstm_size: str
    randomness: str
    epsilon: float = PAPER_EPSILON
    delta: float = PAPER_DELTA
    dpsgd_clip: float = 0.1  # the paper's C for DPSGD
    selective_clip: float = 1e-3  # the paper's C for S-DPSGD: gradients and hidden states
    max_len: int = 96
    # ci: one noise multiplier instead of the target epsilon (PLD calibration outlasts the ci training)
    noise_multiplier: float | None = None


SCALES = {
    "ci": Settings(articles=8, eval_articles=4, vocabulary=400, steps=30, batch_size=16, lr=1e-2, seeds=(0,),
                   canaries=1, canary_repeats=10, lstm_size="tiny", randomness="seeded", noise_multiplier=1.0),
    "cpu": Settings(articles=20, eval_articles=20, vocabulary=5_000, steps=400, batch_size=32, lr=1e-2, seeds=(0,),
                    canaries=2, canary_repeats=10, lstm_size="tiny", randomness="secure", max_len=64),
    # gpu: the paper's model on the whole training file, every word of the validation file in the vocabulary;
    # delta 1e-5, not the paper's 8e-5, which is above one over the whole file's sentences (and private digits)
    "gpu": Settings(articles=None, eval_articles=None, vocabulary=50_000, steps=6000, batch_size=64, lr=2e-3,
                    seeds=(0, 1, 2), canaries=10, canary_repeats=10, lstm_size="paper", randomness="secure",
                    delta=1e-5),
}


class PrivateBatches(NamedTuple):
    """How the private rows from a start read the text, when not as the noiseless ones do."""

    batch_size: int
    steps: int
    public_steps: int  # selective's redacted phase


@dataclass(frozen=True)
class StartSettings:
    """The rows from a pretrained start (``--start``): the start's own tokenizer and model, fewer steps than
    the LSTM (a 135M-parameter step costs about a thousand LSTM steps on a CPU), selective in its two-phase
    form (a transformer has no recurrent state to clip), and canaries as in the LSTM rows."""

    steps: int
    public_steps: int  # selective's phase 1, on the redacted text
    batch_size: int
    lr: float
    # The private rows (dpsgd, selective) may read the same text in fewer, larger batches: at a fixed epsilon,
    # four times the batch for a quarter of the steps cuts the noise per coordinate of an averaged update by
    # more than three (`uedp epsilon --mechanism dpsgd --users 2030 --count-public --target-epsilon 4.9 --delta
    # 8e-5`: noise-to-signal 0.0314 at batch 16 and 150 steps, past the 0.03 where measured runs stopped
    # learning; 0.0094 at batch 64 and 40 steps), for the same number of sequences read. None: as above.
    private: PrivateBatches | None = None

    def groups(self) -> list[tuple[list[str], dict[str, float]]]:
        """The start's sweeps: the mechanisms and the settings each trains with."""
        same = {"steps": self.steps, "public_steps": self.public_steps, "batch_size": self.batch_size, "lr": self.lr}
        if self.private is None:
            return [(["noiseless", "deid", "dpsgd", "selective"], same)]
        batch, steps, public = self.private.batch_size, self.private.steps, self.private.public_steps
        return [(["noiseless", "deid"], same),
                (["dpsgd", "selective"], {**same, "batch_size": batch, "steps": steps, "public_steps": public})]

    def words(self) -> str:
        """How the start's rows train, as the page says it."""
        said = f"{self.steps} steps of batch {self.batch_size} at learning rate {self.lr:g}"
        if self.private is None:
            return said + (f" (selective: {self.public_steps} steps on the redacted text first, then DP-SGD on the "
                           "whole text, the paper's two-phase form for transformers)")
        batch, steps, public = self.private.batch_size, self.private.steps, self.private.public_steps
        return (said + f" for noiseless and deid; dpsgd {steps} steps of batch {batch}, and selective {public} steps "
                f"of batch {batch} on the redacted text, then {steps} under DP-SGD on the whole text (the paper's "
                "two-phase form for transformers). The private rows read about as many sentences as the others, in "
                "larger batches: at the same epsilon that lowers the noise per coordinate of an averaged update "
                f"(`uedp epsilon --mechanism dpsgd --users N --count-public --batch-size {batch} --steps {steps}` "
                f"prints it beside --batch-size {self.batch_size} --steps {self.steps}'s; past 0.03 this project's "
                "measured runs stopped learning)")


FROM_START = {"ci": StartSettings(steps=4, public_steps=2, batch_size=4, lr=1e-2),
              "cpu": StartSettings(steps=150, public_steps=75, batch_size=16, lr=2e-3, private=PrivateBatches(batch_size=64, steps=40, public_steps=20)),
              "gpu": StartSettings(steps=2000, public_steps=1000, batch_size=32, lr=5e-4)}
NEAR_NOISELESS = 1.15  # the target from a pretrained start: dpsgd and selective within 15% of noiseless


def render(ctx: Context, results: Results) -> Page:
    """The page from figures already measured (``uedp reproduce --page-only``)."""
    return page(ctx, SCALES[ctx.scale], results)


# --- inputs -------------------------------------------------------------------------------------------


def corpus_files(ctx: Context) -> dict[str, Path]:
    """Each split's file in the corpus folder, in either layout (pytorch/examples' or the archive's). The
    training file may be absent (it is the one most often missing from offline copies): see :func:`layout`."""
    folder = corpus_folder(ctx, "wikitext", ["|".join(SPLIT_FILES[split]) for split in ("valid", "test")])
    return {split: next(folder / n for n in names if (folder / n).exists())
            for split, names in SPLIT_FILES.items() if any((folder / n).exists() for n in names)}


@dataclass(frozen=True)
class Layout:
    """The articles each split reads, and the public text the vocabulary comes from. With WikiText-2's
    training file, as the paper split it (the vocabulary from the whole validation file, which no run
    trains on). Without it, a document split of the validation file: its first articles are the training
    text, the rest the validation split and the vocabulary's source, so the vocabulary still never comes
    from text a run trains on or is tested on."""

    train: list[list[str]]
    valid: list[list[str]]
    test: list[list[str]]
    vocabulary: list[list[str]]
    train_source: str  # in words, for the page
    vocabulary_source: str
    tag: str  # names the dataset and the tokenizer: a different split is never taken for another


def layout(ctx: Context, s: Settings) -> Layout:
    from uedp.storage.formats.wikitext import wikitext_articles

    files = corpus_files(ctx)
    valid, test = wikitext_articles(files["valid"]), wikitext_articles(files["test"])
    test = test[:s.eval_articles] if s.eval_articles else test
    evaluated = f"train{s.articles or 'all'}-eval{s.eval_articles or 'all'}"
    if "train" in files:
        train = wikitext_articles(files["train"])
        return Layout(train[:s.articles] if s.articles else train, valid[:s.eval_articles] if s.eval_articles else valid,
                      test, valid, f"{len(train[:s.articles] if s.articles else train)} of the {TRAIN_ARTICLES} articles "
                      f"of its training file ({files['train'].name})", f"the whole validation file "
                      f"({files['valid'].name})", evaluated)
    if len(valid) < 2:
        raise UedpError(f"{files['valid']}: {len(valid)} article(s); without {' or '.join(SPLIT_FILES['train'])} the "
                        "page trains on the validation file's first articles and needs at least one more to hold out")
    cut = min(s.articles or len(valid), len(valid) * 2 // 3) or 1
    held = valid[cut:]
    return Layout(valid[:cut], held[:s.eval_articles] if s.eval_articles else held, test, held,
                  f"the first {cut} of the {len(valid)} articles of its validation file ({files['valid'].name}), "
                  f"because its training file is absent here: a small part of the paper's {TRAIN_ARTICLES} "
                  "training articles", f"the validation file's other {len(held)} articles (no run trains on them)",
                  f"fromvalid{cut}-eval{s.eval_articles or 'all'}")


def test_file(ctx: Context, split: Layout) -> Path:
    """The test articles' copy the runs are judged on (a start's perplexity before fine-tuning is too)."""
    return prepare_inputs(ctx, split)[0][-1]


def canary_article() -> str:
    """The paper's canary as one more training article (a user of its own), its sentence ten times."""
    return " = My ID = \n \n" + "".join(f" {CANARY_TEXT} \n" for _ in range(CANARY_REPEATS))


def prepare_inputs(ctx: Context, split: Layout) -> tuple[list[Path], str]:
    """Copies of the layout's articles under the data home, in WikiText's format: the training articles
    with the canary's article after them, the validation and test articles. Returns the files (train.txt,
    valid.txt, test.txt) and the dataset name."""
    folder = ctx.home.reproduce_dir / "inputs" / f"wikitext2-{split.tag}"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, articles in (("train", split.train), ("valid", split.valid), ("test", split.test)):
        text = "".join(line for article in articles for line in article)
        if name == "train":
            text += canary_article()
        written.append(write_if_changed(folder / f"{name}.txt", text))
    return written, f"wikitext2-{split.tag}"


def ingest_and_detect(ctx: Context, split: Layout) -> tuple[str, list[Path]]:
    """Ingest the copies (one user per article) and mark every digit run with the digit policy."""
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.detect import detect_flow
    from uedp.flows.ingest import IngestConfig, ingest_flow

    paths, dataset = prepare_inputs(ctx, split)
    ctx.say(f"ingest {dataset} from {paths[0].parent}")
    ingest_flow(IngestConfig(home=str(ctx.home.root), dataset=dataset, format="wikitext", files=[str(p) for p in paths]))
    ctx.say(f"detect digits in {dataset} with {POLICY.name}")
    detect_flow(dataset, DetectorConfig(detectors=["presidio"], spacy_model=str(blank_pipeline(ctx)),
                                        recognizers=str(POLICY), default_recognizers=False,
                                        presidio_entities=[CATEGORY]), home=str(ctx.home.root))
    return dataset, paths


def build_tokenizer(ctx: Context, s: Settings, split: Layout) -> tuple[Path, int]:
    """The word-level tokenizer from the most frequent words of the layout's vocabulary text (public text no
    run trains on or is tested on), saved where ``tokenizer=FOLDER`` reads it; the folder is named by its
    word list, so a changed vocabulary is never taken for an earlier one (a run's fingerprint holds the folder)."""
    from uedp.models.tokenization import most_frequent_words, save_word_level_tokenizer

    texts = [line for article in split.vocabulary for line in article if not line.strip().startswith("= ")]
    words = most_frequent_words(texts, s.vocabulary)
    digest = hashlib.sha256("\n".join(words).encode()).hexdigest()[:12]
    folder = ctx.home.reproduce_dir / "tokenizers" / f"wikitext2-valid-{len(words)}-{digest}"
    if not (folder / "tokenizer.json").is_file():
        save_word_level_tokenizer(words, folder, f"the {len(words)} most frequent words of {split.vocabulary_source}")
    ctx.say(f"word-level tokenizer: the {len(words)} most frequent words of {split.vocabulary_source}, digits 0-9, "
            "<unk>")
    return folder, len(words)


# --- runs ---------------------------------------------------------------------------------------------


def run(ctx: Context) -> Page:
    from uedp.services.sweep_config import SweepConfig

    s = SCALES[ctx.scale]
    split = layout(ctx, s)
    dataset, _ = ingest_and_detect(ctx, split)
    tokenizer, words = build_tokenizer(ctx, s, split)
    base = dict(home=str(ctx.home.root), dataset=dataset, category_sets=[[CATEGORY]], seeds=list(s.seeds),
                target_epsilons=[] if s.noise_multiplier else [s.epsilon], noise_multiplier=s.noise_multiplier,
                model="lstm", model_size=s.lstm_size, tokenizer=str(tokenizer), steps=s.steps,
                batch_size=s.batch_size, lr=s.lr, delta=s.delta, max_len=s.max_len, canaries=s.canaries,
                canary_repeats=s.canary_repeats, canary_formats=[MISSED_FORMAT], randomness=s.randomness,
                device=ctx.device, threads=ctx.threads, precision=ctx.precision, checkpoint_every=0)
    # The paper's clipping bounds differ by mechanism (DPSGD C = 0.1, S-DPSGD C = 1e-3): two sweeps (noiseless
    # and deid clip nothing).
    groups: list[tuple[list[str], dict[str, float]]] = [
        (["noiseless", "deid", "selective"], {"clip": s.selective_clip, "hidden_clip": s.selective_clip}),
        (["dpsgd"], {"clip": s.dpsgd_clip})]
    results = Results()
    for mechanisms, settings in groups:
        config = SweepConfig.model_validate({**base, "mechanisms": mechanisms, **settings})
        results.runs += run_sweep(ctx, config, f"lstm {s.lstm_size}")
    start = prepare_start(ctx, BASES[ctx.scale], test_file(ctx, split), "wikitext")
    if start is not None:
        f = FROM_START[ctx.scale]
        ctx.say(f"noiseless, deid, dpsgd and selective from {start.family}")
        for mechanisms, settings in f.groups():
            config = SweepConfig.model_validate({**base, **start.run_settings, "mechanisms": mechanisms,
                                                 "tokenizer": "byte", **settings})
            results.runs += run_sweep(ctx, config, start.family, start.name)
    record_start(results, start)
    for index, row in enumerate(results.runs):
        ctx.say(f"canary exposure of {row.label}: the marked canary and the missed secrets")
        extra = canary_figures(ctx, row.run_id)
        extra["marked_canary_exposure"] = measured_once(ctx, row.run_id, "marked_canary_exposure",
                                                        partial(marked_canary_exposure, ctx, row.run_id))
        results.runs[index] = replace(row, extra={**row.extra, **extra})
    results.figures.update(dataset=dataset, vocabulary=words, tokenizer=tokenizer.name, train_source=split.train_source,
                           vocabulary_source=split.vocabulary_source,
                           private_token_share=private_token_share(ctx, dataset, tokenizer))
    return page(ctx, s, results)


def marked_canary_exposure(ctx: Context, run_id: str) -> float:
    """Exposure of the canary written into the training file (which the digit policy marks), under the
    run's logged model and tokenizer: the same estimate as ``uedp attack --kind canary`` (Carlini et al.'s
    skew-normal fit over 10^6 candidates)."""
    import tempfile

    from uedp.models.device import resolve_device
    from uedp.models.saving import load_saved
    from uedp.models.tokenization import load_tokenizer
    from uedp.privacy.attacks.canaries import Canary, canary_format, exposure, model_log_perplexity
    from uedp.services.config import TrainConfig
    from uedp.services.tracking import RunTracker

    tracker = RunTracker.attach(ctx.home, run_id)
    device = resolve_device(ctx.device)
    with tempfile.TemporaryDirectory() as tmp:
        logged = tracker.download("resolved_config.json", Path(tmp))
        model_dir = tracker.download("model", Path(tmp))
        if logged is None or model_dir is None:
            raise UedpError(f"run {run_id} has no stored model or configuration (it planted no canaries?)")
        config = TrainConfig.from_logged(json.loads(logged.read_text(encoding="utf-8"))["config"])
        tokenizer = load_tokenizer(model_dir)
        model = load_saved(model_dir, config.model).to(device)
    fmt = canary_format("digits:6")
    canary = Canary(fmt.name, CANARY_SECRET, fmt.secret_at(CANARY_SECRET), CANARY_TEXT, "", CANARY_REPEATS)
    assert fmt.template.format(secret=canary.secret) == CANARY_TEXT
    return exposure(canary, model_log_perplexity(model, tokenizer, device, config.max_len), seed=0).exposure


def private_token_share(ctx: Context, dataset: str, tokenizer_dir: Path) -> dict[str, float]:
    """Of the train split (without the canary's article), the share of the models' tokens, of the
    whitespace words and of the sentences that the digit policy marks private; and whether it marks
    exactly the digit tokens (digit tokens left public, other tokens made private: both should be 0)."""
    from uedp.models.tokenization import load_tokenizer
    from uedp.storage.catalog import Catalog

    tokenizer = load_tokenizer(tokenizer_dir)
    with Catalog(ctx.home, dataset) as catalog:
        spans = catalog.entity_spans([CATEGORY], "train")
        rows = [(sid, text) for sid, _, text in catalog.sentences("train") if text.strip() != CANARY_TEXT]
    tokens = private = words = private_words = sentences = private_sentences = digits_public = others_private = 0
    for start in range(0, len(rows), 1024):
        chunk = rows[start:start + 1024]
        encoded = tokenizer([t for _, t in chunk], add_special_tokens=False, return_offsets_mapping=True)
        for (sid, text), offsets in zip(chunk, encoded["offset_mapping"]):
            found = [(a, b) for a, b, _, _ in spans.get(sid, [])]
            sentences += 1
            private_sentences += bool(found)
            for a, b in offsets:
                marked = any(a < end and begin < b for begin, end in found)
                digit = text[a:b].isdecimal()  # a digit token (0-9, or another script's digit: <unk>)
                tokens += 1
                private += marked
                digits_public += digit and not marked
                others_private += marked and not digit
            position = 0
            for word in text.split():
                a = text.index(word, position)
                position = a + len(word)
                words += 1
                private_words += any(a < end and begin < position for begin, end in found)
    return {"tokens": private / max(tokens, 1), "words": private_words / max(words, 1),
            "sentences": private_sentences / max(sentences, 1), "digit_tokens_public": float(digits_public),
            "other_tokens_private": float(others_private), "train_tokens": float(tokens)}


# --- claims -------------------------------------------------------------------------------------------


def claims(s: Settings) -> list[Claim]:
    def order(r: Results) -> tuple[bool, str]:
        n, sel, dp = (r.perplexity(m) for m in ("noiseless", "selective", "dpsgd"))
        return n < sel < dp, f"noiseless {number(n, 4)} < selective {number(sel, 4)} < dpsgd {number(dp, 4)}"

    def selective_beats_dpsgd(r: Results) -> tuple[bool, str]:
        sel, dp = r.perplexity("selective"), r.perplexity("dpsgd")
        return sel < dp, f"selective {number(sel, 4)}, dpsgd {number(dp, 4)} (test perplexity)"

    def equal_epsilon(r: Results) -> tuple[bool, str]:
        dp, sel = (_mean([x.epsilon for x in r.select(m)]) for m in ("dpsgd", "selective"))
        close = all(abs(e - s.epsilon) <= 0.05 * s.epsilon for e in (dp, sel))
        return close, f"dpsgd {dp:.3g}, selective {sel:.3g} (target {s.epsilon:g}, delta {_delta(s.delta)})"

    def policy_exact(r: Results) -> tuple[bool, str]:
        share = r.figures["private_token_share"]
        exact = share["digit_tokens_public"] == 0 and share["other_tokens_private"] == 0 and share["tokens"] > 0
        return exact, (f"{share['tokens']:.2%} of {share['train_tokens']:.0f} train tokens private; digit tokens "
                       f"left public {share['digit_tokens_public']:.0f}, other tokens made private "
                       f"{share['other_tokens_private']:.0f}")

    def marked_hidden(r: Results) -> tuple[bool, str]:
        n, dp, sel = (r.extra(m, "marked_canary_exposure") for m in ("noiseless", "dpsgd", "selective"))
        ours = f"noiseless {n:.2f}, dpsgd {dp:.2f}, selective {sel:.2f}"
        if unmeasurable := exposure_unmeasurable(n):
            return False, f"{ours} ({unmeasurable})"
        return clearly_above(n, dp) and clearly_above(n, sel), ours

    def missed_exposed(r: Results) -> tuple[bool, str]:
        n, dp, sel, deid = (r.extra(m, "canary_exposure_mean") for m in ("noiseless", "dpsgd", "selective", "deid"))
        ours = f"selective {sel:.2f}, deid {deid:.2f}, dpsgd {dp:.2f}"
        if unmeasurable := exposure_unmeasurable(n):
            return False, f"{ours} ({unmeasurable})"
        return clearly_above(sel, dp) and clearly_above(deid, dp), ours

    def missed_selective_vs_deid(r: Results) -> tuple[bool, str]:
        n, sel, deid = (r.extra(m, "canary_exposure_mean") for m in ("noiseless", "selective", "deid"))
        ps, pd = r.perplexity("selective"), r.perplexity("deid")
        ours = f"selective {sel:.2f} (perplexity {number(ps, 4)}), deid {deid:.2f} ({number(pd, 4)})"
        if unmeasurable := exposure_unmeasurable(n):
            return False, f"{ours} ({unmeasurable})"
        return clearly_above(deid, sel), ours

    return [
        Claim("the digit policy marks every digit token of the train split private, and no other token",
              "F outputs 0 (private) exactly for digit tokens (section 5)", "reproduces", policy_exact),
        Claim(f"at {budget_at(s)}, selective beats dpsgd in test perplexity", "S-DPSGD 160.04 against DPSGD 305.86 at "
              "epsilon ~4.9 (Table 2)", "reproduces", selective_beats_dpsgd),
        Claim(f"at {budget_at(s)}, the LSTM orders noiseless < selective < dpsgd in test perplexity", "No-DP 60.98 < "
              "S-DPSGD 160.04 < DPSGD 305.86 (Table 2)", "reproduces", order, ("cpu", "gpu")),
        Claim("dpsgd and selective end at the same accounted epsilon (within 5% of the target)", "DPSGD 4.89, "
              "S-DPSGD 4.91 at delta 8e-5 (Table 2)", "reproduces", equal_epsilon, ("cpu", "gpu")),
        Claim("the canary the policy marks (\"My ID is 341752\", 10 times) is exposed less by dpsgd and by "
              "selective than by noiseless", "No-DP's exposure goes up to ~20; DPSGD and S-DPSGD stay low "
              "(Fig. 3b)", "reproduces", marked_hidden, ("cpu", "gpu")),
        Claim("secrets the policy misses (here: planted after detection, as a number the policy failed to mark "
              "would be) are exposed more by selective and by deid than by dpsgd", "the missed "
              "secret's exposure rises under S-DPSGD and data anonymization as the model fits (Fig. 6)",
              "reproduces", missed_exposed, ("cpu", "gpu")),
        Claim("selective exposes a missed secret less than deid (data anonymization)", "S-DP has lower exposure "
              "than anonymization in the middle perplexity range (Fig. 6, section 5.4.2)", "reproduces",
              missed_selective_vs_deid, ("cpu", "gpu")),
    ]


def _delta(delta: float) -> str:
    return f"{delta:g}".replace("e-0", "e-")  # 8e-5, as the paper writes it


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


# --- the page -----------------------------------------------------------------------------------------


def start_claims(start: Start) -> list[Claim]:
    """The claims a pretrained start is judged on: the paper's ordering, and the targets a start must meet
    (dpsgd and selective within 15% of noiseless from the same start, every private model better than the
    start before fine-tuning)."""
    def selective_beats_dpsgd(r: Results) -> tuple[bool, str]:
        sel, dp = r.perplexity("selective"), r.perplexity("dpsgd")
        return sel < dp, f"selective {number(sel, 4)}, dpsgd {number(dp, 4)} (test perplexity, its own tokens)"

    def near_noiseless(r: Results) -> tuple[bool, str]:
        n = r.perplexity("noiseless")
        ratios = {m: r.perplexity(m) / n for m in ("dpsgd", "selective")}
        return all(v <= NEAR_NOISELESS for v in ratios.values()), f"noiseless {number(n, 4)}; " + ", ".join(
            f"{m} {v:.2f}x" for m, v in ratios.items())

    def beats_start(r: Results) -> tuple[bool, str]:
        values = {m: r.perplexity(m) for m in ("dpsgd", "selective")}
        return all(v < start.before for v in values.values()), f"before fine-tuning {number(start.before, 4)}; " \
            + ", ".join(f"{m} {number(v, 4)}" for m, v in values.items())

    return [
        Claim("selective (two-phase) beats dpsgd in test perplexity", "S-DPSGD 160.04 against DPSGD 305.86 "
              "(Table 2, LSTM from scratch)", "extends", selective_beats_dpsgd),
        Claim(f"dpsgd and selective end within {NEAR_NOISELESS:.2f}x of noiseless's test perplexity", "private "
              "fine-tuning of a pretrained model comes close to non-private (Table 3, GPT-2)", "extends",
              near_noiseless, ("cpu", "gpu")),
        Claim("dpsgd and selective are better than the pretrained start before fine-tuning", "(implied: fine-tuning "
              "helps)", "extends", beats_start, ("cpu", "gpu")),
    ]


def start_section(ctx: Context, results: Results, start: Start) -> tuple[str, list[Verdict]]:
    """The rows from a pretrained start: what it is and trains, its table and its own claims."""
    f = FROM_START[ctx.scale]
    verdicts = labelled(judge(start_claims(start), results, ctx.scale), start)
    rows = [["(the start, before fine-tuning)", "-", number(start.before, 4), "-", "-", "-", "-"]]
    for row in sorted(results.runs, key=lambda r: (ORDER.get(r.label, 9), r.run_id)):
        form = {"selective": "two-phase", "deid": "digits redacted"}.get(row.label, "")
        rows.append([row.label + (f" ({form})" if form else ""), number(row.epsilon), number(row.perplexity, 4),
                     number(row.extra.get("marked_canary_exposure", math.nan)),
                     number(row.extra.get("canary_exposure_mean", math.nan)), f"{row.seconds:.0f} s",
                     f"`{row.run_id[:8]}`"])
    text = (f"## From a pretrained start: {start.family}\n\n{start_paragraph(start)} The same training articles, "
            f"policy, canaries and epsilon as the LSTM; {f.words()}; "
            "fewer steps than the LSTM's because a step of a 135M-parameter model costs about a thousand of the "
            "LSTM's on a CPU.\n\n"
            + markdown_table(["mechanism", "accounted epsilon", "test perplexity (its own tokens)",
                              "marked canary exposure", "missed secrets' exposure (mean)", "wall time", "MLflow run"],
                             rows, "---|---:|---:|---:|---:|---:|---")
            + "\n\n" + verdict_table(verdicts))
    return text, verdicts


def page(ctx: Context, s: Settings, results: Results) -> Page:
    scratch, started = split_by_start(results)
    start = recorded_start(results)
    from_start, start_verdicts = (start_section(ctx, started, start) if start is not None and started is not None
                                  else ("", []))
    results_all, results = results, scratch
    verdicts = judge(claims(s), results, ctx.scale)
    rows = []
    for row in sorted(results.runs, key=lambda r: (ORDER.get(r.label, 9), r.run_id)):
        form = {"selective": "recurrent", "deid": "digits redacted"}.get(row.label, "")
        rows.append([row.label + (f" ({form})" if form else ""), number(row.epsilon),
                     number(row.perplexity, 4), number(row.extra.get("marked_canary_exposure", math.nan)),
                     number(row.extra.get("canary_exposure_mean", math.nan)), f"{row.seconds:.0f} s",
                     f"`{row.run_id[:8]}`"])
    share = results.figures["private_token_share"]
    words = results.figures["vocabulary"]
    # pages made before the layout was recorded trained on the training file's first articles
    used = results.figures.get("train_source") or (
        f"the first {s.articles} of its {TRAIN_ARTICLES} training articles" if s.articles else "its whole training file")
    vocabulary_source = results.figures.get("vocabulary_source", "the whole validation file")
    evaluated = f"the first {s.eval_articles} articles of" if s.eval_articles else "the whole"
    budget = (f"noise multiplier {s.noise_multiplier:g} (no calibration at this scale; epsilon accounted)"
              if s.noise_multiplier else f"noise calibrated to epsilon {s.epsilon:g}")
    sections = [
        INTRO,
        f"**Data.** `{results.figures['dataset']}`: WikiText-2, {used} (one user per article), the canary's "
        f"article (\"{CANARY_TEXT}\" {CANARY_REPEATS} times) after them; test perplexity on {evaluated} test file. "
        f"**Policy**: every run of digits ([`digit_policy.yaml`](../../../experiments/digit_policy.yaml), "
        f"a Presidio recognizer, category {CATEGORY}); it marks **{share['tokens']:.1%} of the train split's "
        f"tokens** (ours: words, with numbers split into digits), {share['words']:.1%} of its whitespace words "
        f"and {share['sentences']:.1%} of its sentences. The paper's policy marked {PAPER_PRIVATE_SHARE:.1%} of its "
        "tokens: its BPE tokens hold several digits each (\"12\", \"34\"), ours one, so the same digits are more "
        "of our tokens.",
        f"**Tokenizer.** Word-level, its vocabulary the **{words:,} most frequent words of WikiText-2's "
        f"{vocabulary_source.removeprefix('the ')}**{' (all its words)' if words < s.vocabulary else ''}, which no "
        "run trains on, plus "
        "`<unk>`, the end mark and the ten digits: digits are always single-digit tokens, so no number is ever a vocabulary entry, and "
        "every other word is `<unk>`. The vocabulary is released with every model; built from the training "
        "text, each entry would say that some training sentence holds that word, which no epsilon here covers. "
        "The paper used a BPE tokenizer so that a secret number is split (\"1234\" into \"12\" and \"34\"); "
        "its vocabulary came from WikiText-2's training text (the usual practice; the paper does not say "
        "otherwise), so its entries are outside its epsilons. Ours has fewer words than the paper's (WikiText-2's "
        "own vocabulary is 33,278 words), and perplexities count `<unk>` as a word, so they are not the paper's "
        "in absolute terms.",
        f"**Training.** LSTM `{s.lstm_size}` from scratch (the paper's is `paper`: embedding 200, hidden 200), "
        f"Adam at one learning rate for every mechanism, {s.lr:g} (the paper tuned SGD per model: 20 for No-DP, "
        f"annealed, and 0.05 for DPSGD), {s.steps} steps of "
        f"batch {s.batch_size}, {budget} at delta {_delta(s.delta)} (the paper's 8e-5) for dpsgd (clip "
        f"{s.dpsgd_clip:g}, the paper's C) and selective (gradient and hidden-state clip {s.selective_clip:g}, "
        f"the paper's C); seeds {', '.join(map(str, s.seeds))}; randomness {s.randomness}. dpsgd's unit is one "
        "sentence (add/remove); selective's is one private token's value (replace-one), here one digit. "
        f"{s.canaries} missed secret(s) (uedp's `{MISSED_FORMAT}` canaries, \"Call me on 555-NNNN .\", "
        f"{s.canary_repeats} times each, which no detector marks) in every run.",
        "## Utility and exposure at equal epsilon\n\n![perplexity and exposure](selective.png)\n\n"
        + markdown_table(["mechanism", "accounted epsilon", "test perplexity", "marked canary exposure",
                          "missed secrets' exposure (mean)", "wall time", "MLflow run"], rows,
                         "---|---:|---:|---:|---:|---:|---"),
        "Exposure is log2 of the candidates' count minus log2 of the secret's rank among them (Carlini et al.): "
        "for the marked canary estimated over 10^6 six-digit candidates (19.9 at most), for the missed secrets "
        "exact over 10^4 (13.3 at most); about 1.44 is a random rank.",
        "The paper's figures (WikiText-2, its Table 2 left and Fig. 3b):\n\n"
        + markdown_table(["model", "test perplexity", "top-1 accuracy", "sigma", "C", "epsilon (delta 8e-5)",
                          "canary exposure"], [list(r) for r in PAPER_TABLE2], "---|---:|---:|---:|---:|---:|---"),
        "## The seeds' claims, checked\n\n" + verdict_table(verdicts),
        *([from_start] if from_start else []),
        DISCUSSION,
    ]
    return Page("Selective-DP on WikiText-2: Table 2 (left), canaries and a missed secret", sections,
                {"selective.png": figure(results, s)}, results_all, verdicts + start_verdicts)


def figure(results: Results, s: Settings) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [m for m in ORDER if results.select(m)]
    panels = [("perplexity", "test perplexity (lower is better)", f"utility at {budget_at(s)}"),
              ("marked_canary_exposure", "exposure (lower is safer)", "the marked canary (Fig. 3b)"),
              ("canary_exposure_mean", "exposure (mean; lower is safer)", "missed secrets (Fig. 6)")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.6), dpi=110)
    for panel, (key, ylabel, title) in zip(axes, panels):
        values = []
        for label in labels:
            rows = results.select(label)
            values.append(_mean([r.perplexity if key == "perplexity" else r.extra.get(key, math.nan) for r in rows]))
        bars = panel.bar(range(len(labels)), values, color=[f"C{ORDER[label]}" for label in labels])
        panel.bar_label(bars, fmt="%.3g", fontsize=8, padding=2)
        if key != "perplexity":
            panel.axhline(1.44, color="0.4", linestyle=":", linewidth=1, label="a random rank (~1.44)")
            panel.legend(fontsize=8, loc="upper right")
        finite = [v for v in values if math.isfinite(v)]
        panel.set_ylim(0, 1.3 * max(finite, default=1.0))
        panel.set_xticks(range(len(labels)), labels)
        panel.grid(alpha=0.3, axis="y")
        panel.set(ylabel=ylabel, title=title)
    fig.tight_layout()
    return fig


INTRO = """The Selective-DP paper (`selective-dp.txt`) protects only the tokens a policy marks private. On
WikiText-2, with every digit private (2.8% of the tokens), its S-DPSGD reaches a test perplexity of 160
where DPSGD reaches 306 at the same epsilon (~4.9), against 61 without DP (Table 2, left); a canary
"My ID is 341752" planted ten times is exposed by the model without DP and hidden by both DP models
(Fig. 3b); and a secret the policy misses is exposed by S-DPSGD and by data anonymization alike
(Fig. 6). This page runs the same design with uedp's `selective` mechanism (recurrent form) beside
`noiseless`, `dpsgd` and `deid` (the digits redacted: the paper's anonymization baseline), all with a
word-level tokenizer whose vocabulary comes from public text."""

DISCUSSION = """## What this shows, and what it cannot

- **The two epsilons protect different things**, as the paper says: dpsgd's a whole sentence
  (add/remove), selective's one private token's value (replace-one) with the policy public. A token here
  is one digit: a six-digit number as a whole is protected at up to six times selective's epsilon (group
  privacy), as in the paper, whose tokenizer also splits numbers. A digit the policy missed, and every
  missed secret, is outside selective's epsilon altogether: the missed secrets' exposure measures that gap.
- **Why selective can gain much here** (unlike on CoNLL-2003 with byte tokens, `selective-conll`): few
  tokens are private and most sentences have none, so most of the gradient is the regular, noiseless one;
  with the paper's tiny clip (1e-3) the private gradient and its noise are small beside it, and a state
  after a digit is clipped to almost nothing and noised, which costs the next word little.
- **deid hides the marked canary too**: it never sees the digits the policy found, so it cannot learn
  them at all (the paper's Fig. 5 measures that cost on private tokens; this page does not). A secret the
  policy missed reaches it unredacted, as it reaches selective's regular update.
- **The vocabulary is public by construction** (WikiText-2's validation file); evaluation is on the test
  file; both are outside every guarantee (nothing private is in them, and evaluation releases only
  figures computed without noise on held-out text). The shares of private tokens, words and sentences
  and the count of training tokens above are exact figures about the training text, computed for this
  page without noise: they too are outside every guarantee.
- **Delta.** The cpu scale uses the paper's 8e-5, below one over its sentences and its private digits;
  on the whole training file that is no longer so, and the gpu scale uses 1e-5.
- **Cannot be checked here**: the paper's tokenizer and vocabulary (BPE, learned from the training text)
  and hence its absolute perplexities; its optimizer and schedule (SGD at learning rates 20 and 0.05,
  annealed, five seeds); its Fig. 3c membership inference on 500 secrets and Fig. 5's private-token
  perplexity (not measured by this page); WikiText-2's training file on the machine that made a page
  with fewer than all 600 training articles (the scale says how many)."""
