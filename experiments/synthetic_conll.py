"""The synthetic-text page (``docs/results/synthetic-conll``): what a corpus sampled from a private model is
worth, and what it gives away, on CoNLL-2003 from a public start (the Reuters base, or SmolLM2-135M).

Every model fine-tunes **the Reuters base** (``uedp pretrain`` on Reuters-21578: the cpu reproductions'
gpt2 small and its BPE vocabulary, built once in ``--base-home`` and reused by content key) on CoNLL-2003's
training file, one writer per document, with its model logged: noiseless, then dpsgd, userdp and
uedp-bounded at each target epsilon, with the user-level learning page's settings (user-level DP-SGD,
``--local-update gradient``, server learning rate 1e-3, ``--q-user 0.1``, 10 rounds; uedp-bounded's k
``auto``; categories PER, LOC, ORG, MISC from the gold tags).

From each model, ``uedp generate RUN --measure`` samples ``--count`` texts, each started by the first
``--prompt-words`` words of a sentence of a public corpus (Reuters-21578's ``reut2-000.sgm``, ingested as
``reuters-prompts``; uedp refuses prompts that share a sentence with CoNLL), and writes them as a synthetic
dataset stating the model's guarantee. It then measures:

* **utility**: a model of the same kind, from the same base, trained noiselessly on the synthetic corpus
  (``--utility-steps`` steps) and scored on CoNLL's real test split (``eng.testb``), next to the generating
  model's own test perplexity and the base's before any fine-tuning;
* **leakage**, against the private training text: the share of the corpus' distinct 5-grams found in the
  train split, beside the same share for as many sentences of the test split (writers the model never saw);
  texts that copy a train sentence whole; distinct train-split entity surfaces that appear in the corpus.
  These figures stay in the data home and on this page (a public benchmark): uedp never logs them.

    python experiments/synthetic_conll.py --home /work/synth --base-home /work/synth/base

The yardstick row ``real`` trains the utility model the same way on CoNLL's real train split: a corpus is
worth what it gives against that, and against the start untouched.

From SmolLM2-135M instead (``--start smollm2``: ``uedp base smollm2`` in ``--base-home``, every run LoRA adapters
of ``--lora-rank``; its runs in a data home of their own under ``--home``):

    python experiments/synthetic_conll.py --start smollm2 --epsilons 8,3 --workers 1 --home /work/synth \\
        --base-home /work/smolhome --out docs/results/synthetic-conll-smollm2

It writes ``results.md``, ``results.png``, ``results.json`` and ``command.txt`` under ``--out``; a rerun with
the same ``--home`` skips finished trainings and measured corpora, and ``--page-only`` rewrites the page from
them. The discussion (``README.md``) is written by a person from these figures.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uedp.experiments.learning_results import ReutersBase, page_start, uedp
from uedp.experiments.page import write_command_file
from uedp.experiments.runs import finished_runs, mlflow_client

DATASET = "conll"
PROMPTS = "reuters-prompts"
CATEGORIES = "PERSON,LOC,ORG,MISC"
PRIVATE = ("userdp", "uedp-bounded", "dpsgd")  # the order they run in: the user-level rows first
USER_LEVEL = ("--q-user", "0.1", "--rounds", "10", "--local-update", "gradient", "--server-lr", "0.001")


REAL = "real"  # the yardstick row: the utility measure's training on CoNLL's real train split
REAL_VARIANT = "real-train"  # how its run is told from the noiseless model that generates a corpus
UTILITY_BATCH = 16  # the utility measure's batch (services.synthetic_measures.measure_utility's default)


@dataclass(frozen=True)
class Row:
    mechanism: str  # or REAL
    target: float | None  # None: noiseless, real
    seed: int = 0

    @property
    def name(self) -> str:
        """The synthetic corpus' dataset name (seed 0 keeps the names of the pages made before seeds)."""
        if self.mechanism == REAL:
            return f"{REAL_VARIANT}" + (f"-s{self.seed}" if self.seed else "")
        return (f"synth-{self.mechanism}" + (f"-e{self.target:g}" if self.target is not None else "")
                + (f"-s{self.seed}" if self.seed else ""))


def plan_rows(mechanisms: list[str], epsilons: list[float], seeds: Sequence[int] = (0,)) -> list[Row]:
    """Seed 0 first, and within a seed the yardsticks, then each target epsilon from the largest (an
    interrupted page has whole budgets). The real row once, at the first seed: the utility measure trains
    every corpus' model with seed 0, and the real row is trained as it is."""
    rows = []
    for index, seed in enumerate(seeds):
        rows += [Row(m, None, 0 if m == REAL else seed) for m in (REAL, "noiseless") if m in mechanisms
                 and (m != REAL or index == 0)]
        for target in sorted(epsilons, reverse=True):
            rows += [Row(m, target, seed) for m in PRIVATE if m in mechanisms]
    return rows


def train_flags(row: Row, utility_steps: int) -> list[str]:
    """``uedp train``'s flags for ``row`` (the start's flags are added by the caller). The real row trains as the
    utility measure trains on a corpus: noiseless, ``utility_steps`` steps of its batch."""
    if row.mechanism == REAL:
        return ["--mechanism", "noiseless", "--steps", str(utility_steps), "--batch-size", str(UTILITY_BATCH),
                "--variant", REAL_VARIANT, "--seed", str(row.seed)]
    flags = ["--mechanism", row.mechanism, "--log-model", "--seed", str(row.seed)]
    if row.target is not None:
        flags += ["--target-epsilon", f"{row.target:g}"]
    if row.mechanism in ("userdp", "uedp-bounded"):
        flags += list(USER_LEVEL)
    if row.mechanism == "uedp-bounded":
        flags += ["--categories", CATEGORIES]
    return flags


def matches(row: Row, params: dict[str, str]) -> bool:
    """Whether a finished run's logged parameters are ``row``'s training."""
    target = params.get("target_epsilon")
    target_value = None if target is None or target.lower() == "none" else float(target)
    real = params.get("variant") == REAL_VARIANT
    mechanism = "noiseless" if row.mechanism == REAL else row.mechanism
    return (params.get("mechanism") == mechanism and target_value == row.target and real == (row.mechanism == REAL)
            and int(params.get("seed", 0)) == row.seed)


def trained_run(home: Path, row: Row, dataset: str = DATASET) -> str | None:
    """The finished run of ``row`` on ``dataset`` in the page's data home, if there is one."""
    for run in finished_runs(home, dataset):
        if matches(row, run.data.params) and "perplexity_test" in run.data.metrics:
            return str(run.info.run_id)
    return None


def measures(home: Path, row: Row) -> dict[str, object] | None:
    file = home / "reports" / DATASET / f"synthetic-{row.name}.json"
    kept = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    return kept if "utility" in kept and "leakage" in kept else None


def run_row(home: Path, row: Row, base: ReutersBase, count: int, prompt_words: int, utility_steps: int,
            threads: int = 1, precision: str = "auto") -> None:
    """Train (unless finished), then generate and measure (unless measured; the real row generates nothing).
    A packaged start's runs save a resumable checkpoint every 10 steps (a step costs seconds there)."""
    log = home / "commands.log"
    common = ["--threads", str(threads), "--checkpoint-every", "0" if base.name == "base" else "10", *base.flags(),
              *(["--precision", precision] if precision != "auto" else [])]
    run_id = trained_run(home, row) or None
    if run_id is None:
        out = uedp("train", DATASET, *train_flags(row, utility_steps), *common, home=home, threads=threads, log=log)
        run_id = out.split("MLflow run: ")[1].split()[0]
    if row.mechanism != REAL and measures(home, row) is None:
        uedp("generate", run_id, "--output", row.name, "--count", str(count), "--prompts", PROMPTS,
             "--prompt-words", str(prompt_words), "--measure", "--utility-steps", str(utility_steps), "--device", "cpu",
             home=home, threads=threads, log=log)


def collect(home: Path, rows: list[Row], start: str) -> list[dict[str, object]]:
    """The page's rows: each run's figures beside its corpus' measures."""
    client = mlflow_client(home)  # the store the page's commands logged to (its own, or MLFLOW_TRACKING_URI)
    found = []
    for row in rows:
        run_id = trained_run(home, row)
        measured = {} if row.mechanism == REAL else measures(home, row)
        if run_id is None or measured is None:
            continue
        data = client.get_run(run_id).data
        found.append(page_row(row, start, run_id, data.metrics, data.params, measured))
    return found


def page_row(row: Row, start: str, run_id: str, metrics: dict[str, float], params: dict[str, str],
             measured: dict[str, Any]) -> dict[str, object]:
    """One row of results.json: the shared keys (``corpus`` the private corpus, ``start``, ``seed``,
    ``perplexity_real_test``: the model trained on the corpus, scored on CoNLL's real test file), then the
    generating run's own figures and the corpus' leakage. The real row's figure is its own run's."""
    shared = {"corpus": DATASET, "mechanism": row.mechanism, "target_epsilon": row.target, "start": start,
              "seed": row.seed, "run_id": run_id}
    if row.mechanism == REAL:
        return {**shared, "perplexity_real_test": metrics["perplexity_test"], "epsilon": None, "unit": "none",
                "utility_steps": int(params.get("steps", 0))}
    utility, leakage = measured["utility"], measured["leakage"]
    return {**shared, "perplexity_real_test": utility["perplexity_real_test"],
            "epsilon": metrics.get("final_epsilon"), "unit": params.get("privacy_unit"),
            "perplexity_test": metrics["perplexity_test"], "synthetic_dataset": row.name,
            "utility_run": utility["run_id"], "utility_steps": utility["steps"],
            **{f"leakage_{k}": v for k, v in leakage.items() if k not in ("dataset", "categories")}}


def _number(value: object) -> float:
    assert isinstance(value, (int, float)), value
    return float(value)


def leakage_table(corpora: list[dict[str, object]], reference: str, item: str) -> list[str]:
    """The leakage section of a synthetic page: each corpus' overlap with the private train split beside the same
    figure for held-out text (``reference`` says which), ``item`` naming a record of the corpus."""
    lines = ["", "## Leakage: what each corpus shares with the private training text", "", reference, "",
             "| mechanism | target epsilon | seed | distinct 5-grams in the train split (reference) | texts copying a "
             f"train {item} of 4+ words (reference) | train entity surfaces found (reference) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in corpora:
        lines.append(f"| {r['mechanism']} | {epsilon_text(r['target_epsilon'])} | {r['seed']} | "
                     f"{float(r['leakage_ngram_overlap']):.2%} ({float(r['leakage_ngram_overlap_reference']):.2%}) | "  # type: ignore[arg-type]
                     f"{r['leakage_copied_sentences']} ({r['leakage_copied_sentences_reference']}) | "
                     f"{r['leakage_entity_surfaces']} ({r['leakage_entity_surfaces_reference']}) |")
    return lines


def epsilon_text(value: object) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isinf(value)) else f"{float(value):.3g}"  # type: ignore[arg-type]


def results_page(out: Path, rows: list[dict[str, object]], base: ReutersBase, settings: dict[str, object]) -> None:
    before = base.before.get("eng.testb", next(iter(base.before.values()), math.nan))
    corpora = [r for r in rows if r["mechanism"] != REAL]
    real = [r for r in rows if r["mechanism"] == REAL]
    lines = [f"The start: {base.description}, treated as public. Perplexities count its tokens, on CoNLL-2003's "
             f"real test file (eng.testb); the start scores **{before:.1f}** there before any fine-tuning.",
             f"Each corpus: {settings['count']} texts, each started by the first {settings['prompt_words']} words of a "
             f"Reuters-21578 sentence (public), at most 48 new tokens, temperature 1, top-p 0.95. Utility: a model from "
             f"the same start trained {settings['utility_steps']} steps on the corpus alone, noiselessly"
             + ("; the real row trains it the same way on CoNLL's real train split." if real else "."), "",
             "## Utility: the corpus against the model it came from", "",
             "| mechanism | target epsilon | seed | epsilon (its unit) | model's test perplexity | trained on its "
             "synthetic corpus | better than the start |",
             "|---|---:|---:|---|---:|---:|---|"]
    for r in real:
        ppl = float(r["perplexity_real_test"])  # type: ignore[arg-type]
        lines.append(f"| real train split (no corpus) | - | {r['seed']} | none | - | {ppl:.1f} | "
                     f"{'yes' if ppl < before else 'no'} |")
    for r in corpora:
        unit = f"{epsilon_text(r['epsilon'])} ({str(r['unit']).split(':')[0]})" if r["target_epsilon"] is not None else "none"
        synthetic = float(r["perplexity_real_test"])  # type: ignore[arg-type]
        lines.append(f"| {r['mechanism']} | {epsilon_text(r['target_epsilon'])} | {r['seed']} | {unit} | "
                     f"{float(r['perplexity_test']):.1f} | {synthetic:.1f} | {'yes' if synthetic < before else 'no'} |")  # type: ignore[arg-type]
    lines += leakage_table(corpora, "Reference: as many sentences of the test split (held-out writers, never trained "
                           "on). Figures are computed against the private text; uedp prints them to the curator and "
                           "keeps them in the data home, never in MLflow (this page shows them because CoNLL-2003 is "
                           "a public benchmark).", "sentence")
    if any(r["mechanism"] == "noiseless" for r in corpora):
        lines += ["", "Noiseless's corpus has no guarantee (uedp labels it \"no guarantee\" wherever it shows it): "
                      "it is the yardstick for both tables."]
    (out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "results.json").write_text(json.dumps({"base": asdict(base), "settings": settings, "rows": rows}, indent=1),
                                      encoding="utf-8")
    _figure(out, corpora, before, real, base)


def _figure(out: Path, rows: list[dict[str, object]], before: float, real: list[dict[str, object]],
            base: ReutersBase) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['mechanism']}\n" + (f"eps {epsilon_text(r['target_epsilon'])}" if r["target_epsilon"] is not None else
                                       "no guarantee") + (f", seed {r['seed']}" if r["seed"] else "") for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4.2))
    ax.bar([x - 0.2 for x in xs], [float(r["perplexity_test"]) for r in rows], 0.4, label="the private model")  # type: ignore[arg-type]
    ax.bar([x + 0.2 for x in xs], [float(r["perplexity_real_test"]) for r in rows], 0.4,  # type: ignore[arg-type]
           label="a model trained on its synthetic corpus")
    ax.axhline(before, color="grey", linestyle="--", label=f"the start, not fine-tuned ({before:.0f})")
    if real:
        value = statistics.fmean(_number(r["perplexity_real_test"]) for r in real)
        ax.axhline(value, color="black", linestyle=":", label=f"the same training on the real train split ({value:.0f})")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set(ylabel="perplexity on CoNLL's real test file (lower is better)",
           title=f"CoNLL-2003 from {'the Reuters base' if base.name == 'base' else base.name}: the private model and "
                 "its synthetic corpus")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "results.png")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conll-dir", type=Path, default=Path("../shared/data/conll2003"))
    parser.add_argument("--public-dir", type=Path, default=Path("../shared/data/reuters21578"))
    parser.add_argument("--out", type=Path, default=Path("docs/results/synthetic-conll"))
    parser.add_argument("--home", type=Path, required=True, help="the page's data home (kept: a rerun goes on)")
    parser.add_argument("--base-home", type=Path, help="where the start is built or reused (default: --home's base/)")
    parser.add_argument("--start", choices=("base", "smollm2"), default="base",
                        help="the public start: the Reuters base (`uedp pretrain`) or a packaged base (smollm2: `uedp "
                        "base smollm2`, LoRA adapters of --lora-rank)")
    parser.add_argument("--lora-rank", type=int, default=8, help="a packaged start's LoRA rank")
    parser.add_argument("--max-len", type=int, default=64, help="a packaged start's tokens per sentence")
    parser.add_argument("--mechanisms", default=f"{REAL},noiseless,dpsgd,userdp,uedp-bounded",
                        help=f"the rows ({REAL}: the utility training on the real train split, the yardstick)")
    parser.add_argument("--epsilons", default="2,8")
    parser.add_argument("--seeds", default="0", help="comma-separated; seed 0 first")
    parser.add_argument("--count", type=int, default=1000, help="texts per synthetic corpus")
    parser.add_argument("--prompt-words", type=int, default=2)
    parser.add_argument("--utility-steps", type=int, default=300, help="noiseless steps on each synthetic corpus")
    parser.add_argument("--workers", type=int, default=2, help="rows run side by side, one torch thread each (1: "
                        "one row at a time on two threads, for a packaged start)")
    parser.add_argument("--precision", choices=("auto", "float32", "bf16"), default="auto",
                        help="every run's training forward pass (bf16: about 1.4x faster from SmolLM2 on a CPU with "
                        "bf16 instructions; a utility model trains as its corpus' model did)")
    parser.add_argument("--page-only", action="store_true", help="rewrite the page from the runs in --home")
    args = parser.parse_args()
    started = time.perf_counter()
    # Each start's runs in a data home of their own: a finished row of one start is never taken for another's.
    # runs are found again by mechanism, target and seed: a start of another length or rank gets a home of its own
    home = args.home / ("conll" if args.start == "base" else f"conll-{args.start}-len{args.max_len}-lora{args.lora_rank}")
    log = home / "commands.log"
    # A packaged start's folder and figures, measured once (minutes for a 135M model) for its length and rank.
    base_file = args.home / ("reuters-base.json" if args.start == "base"
                             else f"{args.start}-start-len{args.max_len}-lora{args.lora_rank}.json")
    rows = plan_rows(args.mechanisms.split(","), [float(e) for e in args.epsilons.split(",")],
                     [int(seed) for seed in args.seeds.split(",")])
    settings = {"count": args.count, "prompt_words": args.prompt_words, "utility_steps": args.utility_steps}
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.page_only:
        home.mkdir(parents=True, exist_ok=True)
        test_files = [args.conll_dir / "eng.testb"]
        base = page_start(args.start, base_file, args.base_home or args.home / "base", args.public_dir, test_files,
                          args.max_len, args.lora_rank, threads=1)
        files = [str(args.conll_dir / f) for f in ("eng.train", "eng.testa", "eng.testb")]
        uedp("ingest", "conll2003", *files, "--name", DATASET, home=home, threads=1, log=log)
        uedp("detect", DATASET, "--detector", "gold", home=home, threads=1, log=log)
        uedp("ingest", "reuters21578", str(args.public_dir / "reut2-000.sgm"), "--name", PROMPTS, home=home,
             threads=1, log=log)
        with ThreadPoolExecutor(args.workers) as pool:
            threads = 2 if args.workers == 1 else 1  # the rows share the machine's two cores
            for done in [pool.submit(run_row, home, row, base, args.count, args.prompt_words, args.utility_steps,
                                     threads, args.precision) for row in rows]:
                done.result()
    base = ReutersBase(**json.loads(base_file.read_text(encoding="utf-8")))
    results_page(args.out, collect(home, rows, base.name), base, settings)
    if not args.page_only:
        write_command_file(args.out, (time.perf_counter() - started) / 60,
                           f"{args.workers} rows side by side, 1 torch thread each")
    print(f"wrote {args.out / 'results.md'}")


if __name__ == "__main__":
    main()
