"""``sanitize-conll``: the local-DP thesis' CusText and SanText (its Tables 3.6 and 3.7 and the utility
comparison) on CoNLL-2003: the share of tokens kept, the mask-token inference attack's success and the
perplexity of a model trained on the sanitized text, over the per-token epsilon.

Everything the sanitizers and the attacker need is built offline, from public text only: word vectors
(PPMI-SVD) and a count-based masked LM (:mod:`uedp.privacy.attacks.cloze`), both from CoNLL-2003's validation file (``eng.testa``), which the
page treats as public text the curator and the attacker both hold. The train file is sanitized; the
models are judged on the original test file.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from uedp.experiments.claims import Claim, judge
from uedp.experiments.common import Context, Results
from uedp.experiments.corpora import conll_inputs, ingest_conll_gold
from uedp.experiments.page import UNIFORM_BYTE_PERPLEXITY, Page, markdown_table, number, perplexity_text, verdict_table
from uedp.experiments.runs import run_sweep
from uedp.storage.formats.conll import read_conll

# The thesis, K = 50, SST-2 (its Tables 3.6 and 3.7): share of original tokens kept, and of tokens the
# mask-token inference attack recovers; T = token level, + = stopwords kept. O: the original text.
THESIS = [("T (token level)", "2.82%", "9.92%", "30.31%", "13.54%", "15.33%", "24.44%"),
          ("T+ (stopwords kept)", "43.52%", "47.37%", "57.55%", "26.57%", "31.33%", "39.70%"),
          ("O (original text)", "100%", "", "", "61.93%", "", "")]


@dataclass(frozen=True)
class Settings:
    first: dict[str, int] | None
    steps: int
    batch_size: int
    epsilons: tuple[float, ...]
    keep: tuple[str, ...]  # custext/santext: none (T) and stopwords (T+)
    k: int
    dim: int  # word vectors
    attack_sentences: int
    seeds: tuple[int, ...]
    randomness: str
    model_size: str = "tiny"


SCALES = {
    "ci": Settings(first={"train": 60, "valid": 40, "test": 8}, steps=40, batch_size=16, epsilons=(1.0, 10.0),
                   keep=("none",), k=20, dim=32, attack_sentences=40, seeds=(0,), randomness="seeded"),
    "cpu": Settings(first=None, steps=600, batch_size=32, epsilons=(1.0, 5.0, 10.0), keep=("none", "stopwords"),
                    k=50, dim=64, attack_sentences=200, seeds=(0,), randomness="secure"),
    "gpu": Settings(first=None, steps=5000, batch_size=64, epsilons=(1.0, 3.0, 5.0, 10.0), keep=("none", "stopwords"),
                    k=50, dim=100, attack_sentences=1000, seeds=(0, 1, 2), randomness="secure",
                    model_size="small"),
}


def public_sentences(ctx: Context, s: Settings) -> list[str]:
    """The sentences of the validation file (``eng.testa``): the public text vectors and attacker learn from."""
    paths, _ = conll_inputs(ctx, s.first)
    path = next(p for p in paths if p.name == "eng.testa")
    return [sentence.text for sentence in read_conll(path)]


def build_offline(ctx: Context, s: Settings) -> tuple[Path, Path, int]:
    """Word vectors (``.npz``) and the attacker's masked LM (a bigram cloze model), from the public
    sentences only."""
    from uedp.privacy.attacks.cloze import BigramCloze
    from uedp.privacy.sanitization.embeddings import save_npz, word_vectors_from_text

    texts = public_sentences(ctx, s)
    folder = ctx.home.reproduce_dir / f"sanitize-conll-{ctx.scale}"
    ctx.say(f"word vectors ({s.dim} dimensions) and the attacker's cloze model from {len(texts)} public sentences")
    vectors = save_npz(word_vectors_from_text(texts, dim=s.dim, source="CoNLL-2003 eng.testa (PPMI-SVD)"),
                       folder / "vectors.npz")
    attacker = BigramCloze.fit(texts).save(folder / "attacker-cloze")
    return vectors, attacker, len(texts)


def render(ctx: Context, results: Results) -> Page:
    """The page from figures already measured (``uedp reproduce --page-only``)."""
    return page(ctx, SCALES[ctx.scale], results)


def run(ctx: Context) -> Page:
    from uedp.services.sweep_config import SweepConfig

    s = SCALES[ctx.scale]
    dataset, _ = ingest_conll_gold(ctx, s.first)
    vectors, attacker, public = build_offline(ctx, s)
    config = SweepConfig.model_validate(dict(home=str(ctx.home.root), dataset=dataset, mechanisms=["noiseless", "custext", "santext"],
                         target_epsilons=list(s.epsilons), seeds=list(s.seeds), grid={"keep": list(s.keep)},
                         model="gpt2", model_size=s.model_size, steps=s.steps, batch_size=s.batch_size,
                         embeddings=str(vectors), k=s.k, attack_model=str(attacker),
                         randomness=s.randomness, device=ctx.device, threads=ctx.threads, precision=ctx.precision, checkpoint_every=0))
    # The thesis' names: custext (token level, T) and custext+ (stopwords kept, T+).
    results = Results([replace(row, label=row.label.replace("-keep=none", "").replace("-keep=stopwords", "+"))
                       for row in run_sweep(ctx, config, f"gpt2 {s.model_size}")])
    results.figures.update(dataset=dataset, public_sentences=public, vocabulary_coverage=coverage(ctx, dataset, vectors))
    return page(ctx, s, results)


def coverage(ctx: Context, dataset: str, vectors: Path) -> float:
    """Share of the train split's words the public vocabulary holds (the others are released as <unk>)."""
    from uedp.privacy.sanitization.embeddings import load_vectors, words_of
    from uedp.storage.catalog import Catalog

    embeddings = load_vectors(vectors)
    found = total = 0
    with Catalog(ctx.home, dataset) as catalog:
        for _, _, text in catalog.sentences("train"):
            for word in words_of(text):
                total += 1
                found += embeddings.lookup(word) is not None
    return found / max(total, 1)


def _series(results: Results, mechanism: str, key: str | None, by: str = "epsilon") -> list[tuple[float, float]]:
    """(epsilon, figure) of one release mechanism, by epsilon: the accounted per-token epsilon, or
    (``by="target"``) the epsilon set, the thesis' axis (SanText's accounted one is about twice it)."""
    rows = [r for r in results.runs if r.label == mechanism and r.target is not None]
    return sorted(((r.epsilon if by == "epsilon" else float(r.target or 0)),
                   r.perplexity if key is None else r.extra.get(key, math.nan)) for r in rows)


def claims(s: Settings) -> list[Claim]:
    def rises(key: str, mechanism: str) -> Any:
        def check(r: Results) -> tuple[bool, str]:
            points = _series(r, mechanism, key)
            values = [v for _, v in points]
            return len(values) > 1 and all(a < b for a, b in itertools.pairwise(values)), \
                f"{mechanism}: " + ", ".join(f"{v:.1%} at {e:g}" for e, v in points)
        return check

    def falls_perplexity(mechanism: str) -> Any:
        def check(r: Results) -> tuple[bool, str]:
            points = _series(r, mechanism, None)
            values = [v for _, v in points]
            return len(values) > 1 and values[-1] < values[0], \
                f"{mechanism}: " + ", ".join(f"{perplexity_text(v)} at {e:g}" for e, v in points)
        return check

    def noiseless_best(r: Results) -> tuple[bool, str]:
        base = r.perplexity("noiseless")
        best = min(row.perplexity for row in r.runs if row.label != "noiseless")
        return base < best, f"original text {perplexity_text(base)}; best sanitized {perplexity_text(best)}"

    def stopwords_keep_more(r: Results) -> tuple[bool, str]:
        pairs = [(e, r.extra("custext", "kept_token_share", e), r.extra("custext+", "kept_token_share", e))
                 for e in r.targets()]
        return all(b > a for _, a, b in pairs), "; ".join(f"epsilon {e:g}: T {a:.1%}, T+ {b:.1%}" for e, a, b in pairs)

    def attack_below_original(r: Results) -> tuple[bool, str]:
        base = attack_on_original(r)
        rows = [row for row in r.runs if "mask_inference_success" in row.extra]
        worst = max(rows, key=lambda row: row.extra["mask_inference_success"], default=None)
        if worst is None or math.isnan(base):
            return False, "not measured"
        value = worst.extra["mask_inference_success"]
        return value < base, (f"original text {base:.1%}; most recovered from a release {value:.1%} "
                              f"({worst.label} at epsilon {worst.target:g})")

    def attack_beats_kept_at_low_epsilon(r: Results) -> tuple[bool, str]:
        low = min(r.targets())
        kept = r.extra("custext", "kept_token_share", low)
        attacked = r.extra("custext", "mask_inference_success", low)
        return attacked > kept, f"custext at epsilon {low:g}: {attacked:.1%} recovered, {kept:.1%} kept"

    return [
        Claim("the share of original tokens kept rises with epsilon", "T: 2.82% / 9.92% / 30.31% at epsilon 1 / 5 / "
              "10 (Table 3.6)", "reproduces", rises("kept_token_share", "custext")),
        Claim("the mask-token inference attack recovers more as epsilon rises", "T: 13.54% / 15.33% / 24.44% "
              "(Table 3.7)", "reproduces", rises("mask_inference_success", "custext"), ("cpu", "gpu")),
        Claim("every release hides tokens from the attack: it recovers fewer than from the original text",
              "O 61.93% against at most 39.70% from a release (Table 3.7)", "reproduces", attack_below_original),
        Claim("at the smallest epsilon the attack recovers more tokens than the release keeps unchanged",
              "T at epsilon 1: 13.54% recovered, 2.82% kept (Tables 3.6 and 3.7)", "reproduces",
              attack_beats_kept_at_low_epsilon, ("cpu", "gpu")),
        Claim("keeping stopwords (T+) keeps far more original tokens", "T+ 43.52% against T 2.82% at epsilon 1 "
              "(Table 3.6)", "reproduces", stopwords_keep_more, ("cpu", "gpu")),
        Claim("a model trained on CusText's release improves as epsilon rises", "accuracy rises with epsilon "
              "(Table 3.5)", "reproduces", falls_perplexity("custext"), ("cpu", "gpu")),
        Claim("every sanitized release costs utility against the original text", "O is the best row of every table",
              "reproduces", noiseless_best),
    ]


def attack_on_original(results: Results) -> float:
    """The attack's success on the original text (the thesis' O row): every release's run measures it on
    the same sample of train sentences with the same attacker, so the runs agree; their mean."""
    values = [r.extra["mask_inference_success_original"] for r in results.runs
              if "mask_inference_success_original" in r.extra]
    return sum(values) / len(values) if values else math.nan


def page(ctx: Context, s: Settings, results: Results) -> Page:
    verdicts = judge(claims(s), results, ctx.scale)
    rows = []
    for row in sorted(results.runs, key=lambda r: (r.label != "noiseless", r.label, r.target or 0)):
        name = "noiseless (original text)" if row.label == "noiseless" else row.label
        rows.append([name, "-" if row.target is None else f"{row.target:g}", number(row.epsilon),
                     _share(row.extra.get("kept_token_share", 1.0 if row.label == "noiseless" else math.nan)),
                     _share(attack_on_original(results) if row.label == "noiseless"
                            else row.extra.get("mask_inference_success", math.nan)),
                     number(row.extra.get("epsilon_record_median", math.nan)),
                     perplexity_text(row.perplexity), f"{row.seconds:.0f} s", f"`{row.run_id[:8]}`"])
    sections = [
        INTRO,
        f"Data: `{results.figures['dataset']}`; the train split is sanitized, one independent draw per token "
        f"(`strategy=token`, the thesis' T), CusText with K = {s.k} (balanced mapping) and SanText, per-token "
        f"epsilons {', '.join(f'{e:g}' for e in s.epsilons)} (SanText's is per unit of distance: its per-token "
        f"epsilon, the table's, is that times the vocabulary's diameter, about 2 for these unit vectors); `custext+` "
        f"keeps stopwords (`keep=stopwords`, the thesis' +). Public text: "
        f"{results.figures['public_sentences']} sentences of `eng.testa`, from which {s.dim}-dimensional PPMI-SVD "
        f"word vectors and the attacker (a bigram cloze model: the guess for a masked word is the word a bigram "
        f"model of the public text finds likeliest between its two neighbours) are built. The public vocabulary "
        f"holds {results.figures['vocabulary_coverage']:.1%} of the train split's words; the others, where "
        f"sanitized (every word in T, every word but stopwords in T+), are released as `<unk>` whatever they were, "
        f"and never count as kept. Downstream: GPT-2 `{s.model_size}` from scratch on bytes "
        f"({UNIFORM_BYTE_PERPLEXITY:g} is a uniform guess), {s.steps} steps of batch {s.batch_size}, judged on the "
        f"original test file; seeds {', '.join(map(str, s.seeds))}; randomness {s.randomness}.",
        "## Kept tokens, attack success and perplexity over epsilon\n\n![over epsilon](sanitize.png)\n\n"
        + markdown_table(["release", "epsilon set", "per-token epsilon", "original tokens kept",
                          "mask-inference success", "record epsilon (median)", "test perplexity", "wall time",
                          "MLflow run"], rows, "---|---:|---:|---:|---:|---:|---:|---:|---")
        + f"\n\nThe attack masks each word of {s.attack_sentences} train sentences in turn (the same sentences for every "
          "release) and counts a word recovered when the guess is the original word; on the original text row it "
          "attacks the unsanitized sentences (the thesis' O).",
        "The thesis' figures (SST-2, K = 50, GloVe vectors and bert-base as the attacker), from its text:\n\n"
        + markdown_table(["strategy", "kept at 1", "kept at 5", "kept at 10", "attack at 1", "attack at 5",
                          "attack at 10"], [list(r) for r in THESIS]),
        "## The seeds' claims, checked\n\n" + verdict_table(verdicts),
        DISCUSSION,
    ]
    return Page("CusText and SanText on CoNLL-2003: what local DP keeps, leaks and costs", sections,
                {"sanitize.png": figure(results)}, results, verdicts)


def _share(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1%}"


def figure(results: Results) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullFormatter, NullLocator

    labels = sorted({r.label for r in results.runs if r.target is not None})
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.4), dpi=110)
    panels = (("kept_token_share", "original tokens kept (share)"),
              ("mask_inference_success", "tokens the attack recovers (share)"), (None, "test perplexity (log scale)"))
    for index, label in enumerate(labels):
        for ax, (key, _) in zip(axes, panels):
            points = _series(results, label, key, by="target")
            ax.plot([e for e, _ in points], [v for _, v in points], marker="o", color=f"C{index}", label=label)
    base = [r for r in results.runs if r.label == "noiseless"]
    if base:
        axes[0].axhline(1.0, linestyle="--", color="0.3", label="original text")
        axes[2].axhline(base[0].perplexity, linestyle="--", color="0.3", label="original text")
    original = attack_on_original(results)
    if not math.isnan(original):
        axes[1].axhline(original, linestyle="--", color="0.3", label="original text")
    for ax, (_, title) in zip(axes, panels):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(results.targets()))
        ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set(xlabel="epsilon set (SanText's per-token epsilon is about 2x)", title=title)
        ax.grid(alpha=0.3)
    for ax in axes[:2]:
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0, decimals=0))
    axes[2].set_yscale("log")
    values = [r.perplexity for r in results.runs if math.isfinite(r.perplexity)]
    if values:
        ticks = [t for t in (5, 10, 12, 15, 20, 25, 30, 40, 50, 70, 100, 150, 200, 300)
                 if 0.9 * min(values) <= t <= 1.1 * max(values)]
        axes[2].yaxis.set_major_locator(FixedLocator(ticks))
        axes[2].yaxis.set_major_formatter(FormatStrFormatter("%g"))
        axes[2].yaxis.set_minor_formatter(NullFormatter())
        axes[2].set_ylim(0.9 * min(values), 1.1 * max(values))
    axes[0].legend(fontsize=8, loc="center left")
    fig.tight_layout()
    return fig


INTRO = """The local-DP thesis (`ldp-text-sanitization-thesis.txt`) rewrites each token of a user's text
before it leaves the user: CusText samples from a fixed output set of K neighbours, SanText from the
whole vocabulary, both with the exponential mechanism at a per-token epsilon. It reports how many
original tokens survive (Table 3.6), how many a mask-token inference attack recovers (Table 3.7) and
the downstream accuracy. This page measures the same three on CoNLL-2003 with uedp's `custext` and
`santext` mechanisms, downstream as the perplexity of a language model trained on the release."""

DISCUSSION = """## What this shows, and what it cannot

- **The epsilon is per token**, and a sentence's tokens compose: the record epsilon (median in the
  table) is the per-token epsilon times the number of sanitized tokens, the guarantee a writer's whole
  sentence gets. The thesis states per-token figures only.
- **Where the vectors and the attacker come from.** No GloVe or BERT can be downloaded here, so both
  are built offline from the validation file, which the page treats as public text. Nothing is built
  from the train split: a mapping learnt from the private text would make the release depend on it
  outside the mechanism, and an attacker trained on it would know the answers. The small vocabulary
  sends the words it lacks to `<unk>`, which hides them completely (and costs utility); the thesis'
  GloVe vocabulary covers almost every word.
- **The attacker.** The thesis masks each token of the release in turn and takes a pretrained BERT's
  guess for it. Our attacker guesses the word a bigram model of the public text finds likeliest between
  the two neighbours (`privacy/attacks/cloze.py`). A small BERT trained on the same 3,250 sentences was
  tried first and learnt word frequency only: it guessed "." or "the" at every position, so it
  recovered 6.2% of the original text's words and, because its guesses did not depend on the context,
  the same 6.2% from every release whatever its epsilon. The bigram attacker makes 604 distinct
  guesses on 200 train sentences and recovers 23.1% of their words (`python
  benchmarks/mask_attackers.py`; 24.6% of this page's sample, the table's original text row), and its
  success moves with the context a release keeps. It is still far weaker than bert-base: a stronger
  adversary recovers more than these figures show, and they compare releases with each other, not with
  the thesis' numbers.
- **Cannot be checked here**: SST-2 and QNLI (the thesis' corpora) and its classifiers; its record-
  and dataset-level strategies (withdrawn in uedp: they are not epsilon-DP as specified, docs/PRIVACY.md);
  absolute attack figures (bert-base, pretrained on billions of words, against a bigram model of 3,250
  sentences).
- Test perplexity is computed on original text, outside every guarantee."""
