"""``selective-conll``: the Selective-DP paper's Table 2 (LSTM: No-DP, DPSGD, S-DPSGD at equal
epsilon, with canary exposure) and Table 3 (GPT-2: a redacted model, then private fine-tuning) on
CoNLL-2003, with the gold entities as the private tokens.

Two model families, each at one target epsilon: LSTM (noiseless, dpsgd, selective in its recurrent
form) and GPT-2 (noiseless, deid as the paper's redacted model, dpsgd, selective in its two-phase
form). Every run plants the same made-up secrets ("digits:6", repeated) for the canary exposure, and
the page gives the share of private tokens.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from uedp.experiments.claims import Claim, clearly_above, exposure_unmeasurable, judge
from uedp.experiments.common import Context, Results
from uedp.experiments.corpora import GOLD_CATEGORIES, conll_inputs, ingest_conll_gold
from uedp.experiments.page import (
    UNIFORM_BYTE_PERPLEXITY,
    Page,
    budget_at,
    markdown_table,
    number,
    one_budget_sentence,
    perplexity_text,
    verdict_table,
)
from uedp.experiments.runs import canary_figures, run_sweep
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

# The paper's Table 2 (WikiText-2, LSTM) and Table 3 (WikiText-2, GPT-2 small), from its text.
PAPER_TABLE2 = [("LSTM No-DP", "60.98", "-", "~20 (Fig. 3b)"), ("DPSGD", "305.86", "4.89", "low (Fig. 3b)"),
                ("S-DPSGD", "160.04", "4.91", "low (Fig. 3b)")]
PAPER_TABLE3 = [("redacted model (entities, 16.4% of tokens)", "24.30"),
                ("redacted, then DPSGD on the original (two-phase)", "22.56"),
                ("redacted (entities + subjects, objects, pronouns: 34.8%)", "38.66"),
                ("... then DPSGD on the original", "25.61")]
WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class Settings:
    first: dict[str, int] | None
    steps: int
    public_steps: int  # selective with GPT-2: phase 1 on the redacted text
    batch_size: int
    epsilon: float
    seeds: tuple[int, ...]
    canaries: int
    canary_repeats: int
    lstm_size: str
    gpt2_size: str
    randomness: str
    # ci: one noise multiplier instead of the target epsilon (PLD calibration outlasts the ci training)
    noise_multiplier: float | None = None


SCALES = {
    "ci": Settings(first={"train": 60, "valid": 8, "test": 8}, steps=30, public_steps=15, batch_size=16, epsilon=3.0,
                   seeds=(0,), canaries=2, canary_repeats=10, lstm_size="tiny", gpt2_size="tiny", randomness="seeded",
                   noise_multiplier=1.0),
    "cpu": Settings(first=None, steps=600, public_steps=300, batch_size=32, epsilon=3.0, seeds=(0,), canaries=4,
                    canary_repeats=10, lstm_size="tiny", gpt2_size="tiny", randomness="secure"),
    "gpu": Settings(first=None, steps=5000, public_steps=2000, batch_size=64, epsilon=3.0, seeds=(0, 1, 2),
                    canaries=10, canary_repeats=10, lstm_size="paper", gpt2_size="small", randomness="secure"),
}
FAMILIES = {"lstm": ["noiseless", "dpsgd", "selective"], "gpt2": ["noiseless", "deid", "dpsgd", "selective"]}
# From a pretrained start (starts.py): GPT-2's mechanisms only (the LSTM has no public base), fewer steps
# than from scratch (a pretrained model costs more per token).
FROM_START = {"ci": replace(SCALES["ci"], steps=20, public_steps=10),
              "cpu": replace(SCALES["cpu"], steps=300, public_steps=150),
              "gpu": replace(SCALES["gpu"], steps=2000, public_steps=1000)}
NEAR_NOISELESS = 1.15  # the target from a pretrained start: within 15% of noiseless


def render(ctx: Context, results: Results) -> Page:
    """The page from figures already measured (``uedp reproduce --page-only``)."""
    return page(ctx, SCALES[ctx.scale], results)


def run(ctx: Context) -> Page:

    s = SCALES[ctx.scale]
    dataset, _ = ingest_conll_gold(ctx, s.first)
    results = Results()
    for model, mechanisms in FAMILIES.items():
        size = s.lstm_size if model == "lstm" else s.gpt2_size
        results.runs += run_sweep(ctx, _sweep(ctx, dataset, s, mechanisms, dict(model=model, model_size=size)),
                                  f"{model} {size}")
    start = prepare_start(ctx, BASES[ctx.scale], conll_inputs(ctx, s.first)[0][-1], "conll2003")
    if start is not None:
        ctx.say(f"GPT-2's mechanisms from {start.family}")
        results.runs += run_sweep(ctx, _sweep(ctx, dataset, FROM_START[ctx.scale], FAMILIES["gpt2"],
                                              start.run_settings), start.family, start.name)
    record_start(results, start)
    for index, row in enumerate(results.runs):
        ctx.say(f"canary exposure of {row.label} ({row.family})")
        results.runs[index] = _with(row, canary_figures(ctx, row.run_id))
    results.figures["private_token_share"] = private_token_share(ctx, dataset)
    results.figures["dataset"] = dataset
    return page(ctx, s, results)


def _sweep(ctx: Context, dataset: str, s: Settings, mechanisms: list[str], model: dict[str, Any]) -> Any:
    from uedp.services.sweep_config import SweepConfig

    return SweepConfig.model_validate(dict(
        home=str(ctx.home.root), dataset=dataset, mechanisms=mechanisms, category_sets=[GOLD_CATEGORIES],
        seeds=list(s.seeds), target_epsilons=[] if s.noise_multiplier else [s.epsilon],
        noise_multiplier=s.noise_multiplier, steps=s.steps, public_steps=s.public_steps, batch_size=s.batch_size,
        canaries=s.canaries, canary_repeats=s.canary_repeats, randomness=s.randomness, device=ctx.device,
        threads=ctx.threads, precision=ctx.precision, **{"checkpoint_every": 0, **model}))


def _with(row: Any, extra: dict[str, float]) -> Any:
    from dataclasses import replace

    return replace(row, extra={**row.extra, **extra})


def private_token_share(ctx: Context, dataset: str) -> dict[str, float]:
    """Of the train split (a public benchmark), the share of bytes (the models' tokens) and of
    whitespace words inside a gold entity span: what selective protects and the others do not."""
    from uedp.services.config import TrainConfig
    from uedp.services.training_data import load_training_texts
    from uedp.storage.catalog import Catalog

    config = TrainConfig.model_validate(dict(dataset=dataset, mechanism="selective", noise_multiplier=1.0,
                                              categories=GOLD_CATEGORIES))
    with Catalog(ctx.home, dataset) as catalog:
        training = load_training_texts(catalog, config)
    total_bytes = private_bytes = words = private_words = sentences = private_sentences = 0
    for user, texts in training.texts.items():
        for text, spans in zip(texts, training.spans.get(user, [[] for _ in texts])):
            sentences += 1
            private_sentences += bool(spans)
            total_bytes += len(text.encode())
            private_bytes += sum(len(text[a:b].encode()) for a, b in spans)
            for match in WORD.finditer(text):
                words += 1
                private_words += any(a < match.end() and match.start() < b for a, b in spans)
    return {"bytes": private_bytes / max(total_bytes, 1), "words": private_words / max(words, 1),
            "sentences": private_sentences / max(sentences, 1)}


# The checks both Selective-DP pages make (selective-customersim reuses them): on the first family whose
# name starts with ``model`` (lstm, gpt2), or on every family for the canaries.
Check = Callable[[Results], tuple[bool, str]]


def _first_family(r: Results, model: str) -> str:
    """The first family of ``model``; rows from one start are one family, whatever its name."""
    families = {row.family for row in r.runs}
    if len(families) == 1:
        return families.pop()
    return next(row.family for row in r.runs if row.family.startswith(model))


def family_order(model: str, uniform: float = UNIFORM_BYTE_PERPLEXITY) -> Check:
    """noiseless < selective < dpsgd in test perplexity (``uniform``: a uniform guess over the tokens)."""
    def check(r: Results) -> tuple[bool, str]:
        f = _first_family(r, model)
        n, sel, dp = (r.perplexity(m, family=f) for m in ("noiseless", "selective", "dpsgd"))
        return n < sel < dp, f"{f}: noiseless {perplexity_text(n, uniform)} < selective " \
                             f"{perplexity_text(sel, uniform)} < dpsgd {perplexity_text(dp, uniform)}"
    return check


def selective_beats_dpsgd(model: str, uniform: float = UNIFORM_BYTE_PERPLEXITY) -> Check:
    def check(r: Results) -> tuple[bool, str]:
        f = _first_family(r, model)
        sel, dp = r.perplexity("selective", family=f), r.perplexity("dpsgd", family=f)
        return sel < dp, f"{f}: selective {perplexity_text(sel, uniform)}, dpsgd {perplexity_text(dp, uniform)}"
    return check


def improves_on_redacted(uniform: float = UNIFORM_BYTE_PERPLEXITY) -> Check:
    """GPT-2's two-phase selective against the redacted model (deid) it starts from."""
    def check(r: Results) -> tuple[bool, str]:
        f = _first_family(r, "gpt2")
        sel, red = r.perplexity("selective", family=f), r.perplexity("deid", family=f)
        return sel < red, f"{f}: two-phase {perplexity_text(sel, uniform)}, redacted (deid) " \
                          f"{perplexity_text(red, uniform)}"
    return check


def dpsgd_hides_canaries(r: Results) -> tuple[bool, str]:
    """dpsgd's canary exposure clearly below noiseless', in every family (judged only where measurable)."""
    pairs = [(f, r.extra("noiseless", "canary_exposure_mean", family=f),
              r.extra("dpsgd", "canary_exposure_mean", family=f)) for f in sorted({row.family for row in r.runs})]
    ours = "; ".join(f"{f}: noiseless {n:.2f}, dpsgd {d:.2f}" for f, n, d in pairs)
    unmeasurable = next((why for _, n, _ in pairs if (why := exposure_unmeasurable(n))), None)
    if unmeasurable:
        return False, f"{ours} ({unmeasurable})"
    return all(clearly_above(n, d) for _, n, d in pairs), ours


def missed_secret(r: Results) -> tuple[bool, str]:
    """An unmarked canary's exposure clearly above under selective than under dpsgd, in every family."""
    triples = [(f, r.extra("noiseless", "canary_exposure_mean", family=f),
                r.extra("selective", "canary_exposure_mean", family=f),
                r.extra("dpsgd", "canary_exposure_mean", family=f)) for f in sorted({row.family for row in r.runs})]
    ours = "; ".join(f"{f}: selective {sel:.2f}, dpsgd {d:.2f}" for f, _, sel, d in triples)
    unmeasurable = next((why for _, n, _, _ in triples if (why := exposure_unmeasurable(n))), None)
    if unmeasurable:
        return False, f"{ours} ({unmeasurable})"
    return all(clearly_above(sel, d) for _, _, sel, d in triples), ours


def start_claims(s: Settings, start: Start) -> list[Claim]:
    """GPT-2's claims on the rows from a pretrained start, and the two targets a start must meet: dpsgd
    and selective within 15% of noiseless from the same start, and every private model better than the
    start before fine-tuning."""
    def near_noiseless(r: Results) -> tuple[bool, str]:
        n = r.perplexity("noiseless")
        ratios = {m: r.perplexity(m) / n for m in ("dpsgd", "selective")}
        return all(v <= NEAR_NOISELESS for v in ratios.values()), f"noiseless {perplexity_text(n, start.uniform)}; " \
            + ", ".join(f"{m} {ratio:.2f}x" for m, ratio in ratios.items())

    def beats_start(r: Results) -> tuple[bool, str]:
        values = {m: r.perplexity(m) for m in ("dpsgd", "selective")}
        return all(v < start.before for v in values.values()), f"before fine-tuning {number(start.before)}; " \
            + ", ".join(f"{m} {number(v)}" for m, v in values.items())

    return [
        Claim(f"at {budget_at(s)}, GPT-2's two-phase selective beats dpsgd", "S-DPSGD beats DPSGD (Table 2, LSTM)",
              "extends", selective_beats_dpsgd("gpt2", start.uniform)),
        Claim("GPT-2's two-phase selective improves on the redacted model it starts from (deid)", "22.56 against the "
              "redacted model's 24.30 (Table 3)", "reproduces", improves_on_redacted(start.uniform), ("cpu", "gpu")),
        Claim(f"at {budget_at(s)}, dpsgd and selective are within {NEAR_NOISELESS - 1:.0%} of noiseless from the same "
              "start", "private fine-tuning of a pretrained GPT-2 comes close to non-private (Table 3)", "reproduces",
              near_noiseless, ("cpu", "gpu")),
        Claim("dpsgd and selective are better than the pretrained start before fine-tuning", "(implied: Table 3's "
              "models improve on GPT-2)", "reproduces", beats_start, ("cpu", "gpu")),
        Claim("dpsgd hides the planted secrets better than noiseless (lower exposure)", "No-DP exposure up to ~20; "
              "DPSGD and S-DPSGD low (Fig. 3b)", "reproduces", dpsgd_hides_canaries, ("cpu", "gpu")),
    ]


def claims(s: Settings) -> list[Claim]:
    return [
        Claim(f"at {budget_at(s)}, the LSTM orders noiseless < selective < dpsgd in perplexity",
              "No-DP 60.98 < S-DPSGD 160.04 < DPSGD 305.86 at epsilon ~4.9 (Table 2)", "reproduces",
              family_order("lstm"), ("cpu", "gpu")),
        Claim(f"at {budget_at(s)}, selective beats dpsgd with the LSTM", "S-DPSGD 160.04 against DPSGD "
              "305.86 (Table 2)", "reproduces", selective_beats_dpsgd("lstm"), ("cpu", "gpu")),
        Claim(f"at {budget_at(s)}, GPT-2's two-phase selective (redacted, then DP on the original) beats "
              "dpsgd", "S-DPSGD beats DPSGD (Table 2, LSTM); Table 3 has no GPT-2 DPSGD row", "extends",
              selective_beats_dpsgd("gpt2")),
        Claim("GPT-2's two-phase selective improves on the redacted model it starts from (deid)", "22.56 against the "
              "redacted model's 24.30 (Table 3)", "reproduces", improves_on_redacted(), ("cpu", "gpu")),
        Claim("dpsgd hides the planted secrets better than noiseless (lower exposure)", "No-DP exposure up to ~20; "
              "DPSGD and S-DPSGD low (Fig. 3b)", "reproduces", dpsgd_hides_canaries, ("cpu", "gpu")),
        Claim("a secret the policy does not mark private (the canaries here) is exposed more by selective than by "
              "dpsgd", "S-DP protects only what the policy marks; a missed secret's exposure rises as the model fits "
              "(Fig. 6)", "reproduces", missed_secret, ("cpu", "gpu")),
    ]


def page(ctx: Context, s: Settings, results: Results) -> Page:
    scratch, started = split_by_start(results)
    start = recorded_start(results)
    verdicts = judge(claims(s), scratch, ctx.scale)
    figures = {"selective.png": figure(scratch, s)}
    from_start = []
    if start is not None and started is not None:
        f = FROM_START[ctx.scale]
        verdicts += labelled(judge(start_claims(f, start), started, ctx.scale), start)
        figures["selective-start.png"] = utility_exposure_figure(started, budget_at(f), "test perplexity (its own tokens)")
        from_start = [
            f"## From a pretrained start: {start.family}\n\n{start_paragraph(start)} {f.steps} steps of "
            f"{f.batch_size} (selective: {f.public_steps} noiseless steps on the redacted text first); the same "
            f"canaries.\n\n![perplexity and exposure from the start](selective-start.png)\n\n"
            + _run_table(started, start)]
    scratch_table = _run_table(scratch, None)
    share = results.figures["private_token_share"]
    sections = [
        INTRO,
        f"Data: `{results.figures['dataset']}`, gold {', '.join(GOLD_CATEGORIES)} as the private tokens: "
        f"**{share['words']:.1%} of the train split's words, {share['bytes']:.1%} of its bytes** (the models' "
        f"tokens; the paper's policy marked 16.4% of WikiText-2's tokens)"
        + (f", in {share['sentences']:.1%} of its sentences" if "sentences" in share else "") + ". Models from scratch with byte tokens "
        f"({UNIFORM_BYTE_PERPLEXITY:g} is a uniform guess): LSTM `{s.lstm_size}` and GPT-2 `{s.gpt2_size}`. "
        f"{s.steps} steps of batch {s.batch_size} (selective with GPT-2: {s.public_steps} noiseless steps on the "
        f"redacted text first). {one_budget_sentence(s)} at delta 1e-5 for dpsgd (one sentence, add/remove) "
        f"and selective (one private token, replace-one). {s.canaries} canaries (`digits:6`), each planted "
        f"{s.canary_repeats} times, in every run; seeds {', '.join(map(str, s.seeds))}; randomness {s.randomness}."
        + ("" if start else " " + start_paragraph(None)),
        "## Utility and exposure at equal epsilon\n\n![perplexity and exposure](selective.png)\n\n"
        + scratch_table,
        *from_start,
        "Exposure is log2 of the candidates' count minus log2 of the canary's rank among them (Carlini et al.; "
        "about 1.44 for a random rank, log2(10^6) = 19.9 at most for six digits).",
        "The paper's figures (WikiText-2), from its text:\n\n"
        + markdown_table(["Table 2 (LSTM)", "test perplexity", "epsilon", "canary exposure"],
                         [list(r) for r in PAPER_TABLE2], "---|---:|---:|---")
        + "\n\n" + markdown_table(["Table 3 (GPT-2 small)", "perplexity"], [list(r) for r in PAPER_TABLE3],
                                  "---|---:"),
        "## The seeds' claims, checked\n\n" + verdict_table(verdicts),
        DISCUSSION,
    ]
    return Page("Selective-DP on CoNLL-2003: Table 2 and Table 3 at equal epsilon", sections, figures, results,
                verdicts)


def _run_table(results: Results, start: Start | None) -> str:
    order = {"noiseless": 0, "deid": 1, "dpsgd": 2, "selective": 3}
    uniform = start.uniform if start else UNIFORM_BYTE_PERPLEXITY
    rows = [] if start is None else [[start.family, "(the start, before fine-tuning)", "-",
                                      perplexity_text(start.before, uniform), "-", "-", "-",
                                      f"`{start.run_id[:8]}`" if start.run_id else "-"]]
    for row in sorted(results.runs, key=lambda r: (r.family, order.get(r.label, 9))):
        form = {"selective": "recurrent" if row.family.startswith("lstm") else "two-phase",
                "deid": "redacted model"}.get(row.label, "")
        rows.append([row.family, row.label + (f" ({form})" if form else ""), number(row.epsilon),
                     perplexity_text(row.perplexity, uniform), number(row.extra.get("canary_exposure_mean", math.nan)),
                     number(row.extra.get("canary_exposure_max", math.nan)), f"{row.seconds:.0f} s",
                     f"`{row.run_id[:8]}`"])
    return markdown_table(["model", "mechanism", "accounted epsilon", "test perplexity", "canary exposure (mean)",
                           "exposure (max)", "wall time", "MLflow run"], rows, "---|---|---:|---:|---:|---:|---:|---")


def figure(results: Results, s: Settings) -> Any:
    return utility_exposure_figure(results, budget_at(s), "test perplexity (lower is better)")


def utility_exposure_figure(results: Results, at: str, perplexity_label: str) -> Any:
    """Bars per family: test perplexity and mean canary exposure of noiseless, deid, dpsgd and selective
    (means over seeds); shared with selective-customersim."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = sorted({r.family for r in results.runs})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), dpi=110)
    labels = ["noiseless", "deid", "dpsgd", "selective"]
    width = 0.8 / max(len(families), 1)
    for i, family in enumerate(families):
        for panel, key in zip(axes, ("perplexity", "canary_exposure_mean")):
            xs, ys = [], []
            for j, label in enumerate(labels):
                rows = [r for r in results.runs if r.family == family and r.label == label]
                if rows:
                    values = [r.perplexity if key == "perplexity" else r.extra.get(key, math.nan) for r in rows]
                    xs.append(j + (i - (len(families) - 1) / 2) * width)
                    ys.append(statistics.fmean(values))
            bars = panel.bar(xs, ys, width=width, color=f"C{i}", label=family)
            panel.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
    axes[1].axhline(1.44, color="0.4", linestyle=":", linewidth=1, label="a random rank (~1.44)")
    for panel in axes:
        panel.set_xticks(range(len(labels)), labels)
        panel.grid(alpha=0.3, axis="y")
        # headroom above the tallest bar, so the value labels and the one-row legend never overlap a bar
        heights = [p.get_height() for p in panel.patches if math.isfinite(p.get_height())]
        panel.set_ylim(0, 1.4 * max(heights, default=1.0))
        panel.legend(fontsize=8, loc="upper left", ncol=3)
    axes[0].set(ylabel=perplexity_label, title=f"utility at {at} (noiseless, deid: no guarantee)")
    axes[1].set(ylabel="canary exposure (mean; lower is safer)", title="exposure of the planted secrets")
    fig.tight_layout()
    return fig

INTRO = """The Selective-DP paper (`selective-dp.txt`) protects only the tokens a policy marks private,
and reports that its S-DPSGD reaches a much better perplexity than DPSGD at the same epsilon with an
LSTM (Table 2), and that a GPT-2 first trained on redacted text and then fine-tuned with DP on the
original improves on the redacted model (Table 3). This page runs both designs with uedp's `selective`
mechanism (recurrent form for the LSTM, two-phase form for GPT-2) beside `noiseless`, `deid` (the
redacted model) and `dpsgd`, calibrated to the same target epsilon, on CoNLL-2003 with its gold
entities as the private tokens."""

DISCUSSION = """## What this shows, and what it cannot

- **The epsilons are comparable only with care**, as the paper says: dpsgd's protects a whole sentence
  (add/remove), selective's one private token's value (replace-one), with the policy (which tokens are
  private) public. For the recurrent form with byte tokens, a token is one byte: its epsilon protects one
  byte of a name, and a name of L bytes as a whole only at up to L times it (group privacy). A secret the policy misses is not covered by selective's epsilon at all: the
  canaries here are unmarked made-up numbers, so their exposure under selective measures exactly
  that gap, as the paper's Fig. 6 does for its missed secret.
- **Why the recurrent form gains little here.** Selective's private losses go through DP-SGD like
  dpsgd's, so it saves noise only on sequences without a private token, and it noises, besides, every
  state after a private token. In CoNLL-2003 most sentences name an entity (79% of the train split,
  docs/results/uedp-bounded-conll/holders.md), and with byte tokens one entity is several private
  tokens in a row: little of the data is public, and the recurrent form cannot do much better than
  dpsgd (the table). The paper's word-level policy on WikiText-2 left most sentences public. The
  two-phase form uses the public part differently: it learns the redacted text first, for free.
- **GPT-2's two-phase form** spends no epsilon on the redacted text (nothing private is left in it)
  and its second phase is DP-SGD on whole sequences; its epsilon is therefore DP-SGD's at the
  sentence level, a stronger unit than the recurrent form's.
- **Cannot be checked here**: WikiText-2 and CustomerSim (the paper's corpora) are not on these
  machines; the paper's LSTM is trained on word tokens with a 33k vocabulary, ours on bytes, so
  perplexities are not comparable in absolute terms; pretrained GPT-2 small cannot be downloaded;
  the contextual policy (subjects, objects, pronouns) is not run.
- Test perplexity is computed without noise on held-out documents: evaluation is outside every
  guarantee."""
