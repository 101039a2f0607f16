"""The synthetic-text page (``docs/results/synthetic-conll``): what a corpus sampled from a private model is
worth, and what it gives away, on CoNLL-2003 from the public Reuters base.

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

It writes ``results.md``, ``results.png``, ``results.json`` and ``command.txt`` under ``--out``; a rerun with
the same ``--home`` skips finished trainings and measured corpora, and ``--page-only`` rewrites the page from
them. The discussion (``README.md``) is written by a person from these figures.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from uedp.experiments.learning_results import ReutersBase, reuters_base, uedp
from uedp.experiments.page import write_command_file
from uedp.experiments.runs import finished_runs, mlflow_client

DATASET = "conll"
PROMPTS = "reuters-prompts"
CATEGORIES = "PERSON,LOC,ORG,MISC"
PRIVATE = ("userdp", "uedp-bounded", "dpsgd")  # the order they run in: the user-level rows first
USER_LEVEL = ("--q-user", "0.1", "--rounds", "10", "--local-update", "gradient", "--server-lr", "0.001")


@dataclass(frozen=True)
class Row:
    mechanism: str
    target: float | None  # None: noiseless

    @property
    def name(self) -> str:
        return f"synth-{self.mechanism}" + (f"-e{self.target:g}" if self.target is not None else "")


def plan_rows(mechanisms: list[str], epsilons: list[float]) -> list[Row]:
    rows = [Row("noiseless", None)] if "noiseless" in mechanisms else []
    for target in sorted(epsilons, reverse=True):
        rows += [Row(m, target) for m in PRIVATE if m in mechanisms]
    return rows


def train_flags(row: Row) -> list[str]:
    flags = ["--mechanism", row.mechanism, "--log-model"]
    if row.target is not None:
        flags += ["--target-epsilon", f"{row.target:g}"]
    if row.mechanism in ("userdp", "uedp-bounded"):
        flags += list(USER_LEVEL)
    if row.mechanism == "uedp-bounded":
        flags += ["--categories", CATEGORIES]
    return flags


def trained_run(home: Path, row: Row) -> str | None:
    """The finished run of ``row`` on CoNLL in the page's data home, if there is one."""
    for run in finished_runs(home, DATASET):
        params = run.data.params
        target = params.get("target_epsilon")
        target = None if target in (None, "None", "none") else float(target)
        if params.get("mechanism") == row.mechanism and target == row.target and "perplexity_test" in run.data.metrics:
            return str(run.info.run_id)
    return None


def measures(home: Path, row: Row) -> dict[str, object] | None:
    file = home / "reports" / DATASET / f"synthetic-{row.name}.json"
    kept = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    return kept if "utility" in kept and "leakage" in kept else None


def run_row(home: Path, row: Row, base: ReutersBase, count: int, prompt_words: int, utility_steps: int) -> None:
    """Train (unless finished), then generate and measure (unless measured)."""
    log = home / "commands.log"
    common = ["--threads", "1", "--checkpoint-every", "0", *base.flags()]
    run_id = trained_run(home, row) or None
    if run_id is None:
        out = uedp("train", DATASET, *train_flags(row), *common, home=home, threads=1, log=log)
        run_id = out.split("MLflow run: ")[1].split()[0]
    if measures(home, row) is None:
        uedp("generate", run_id, "--output", row.name, "--count", str(count), "--prompts", PROMPTS,
             "--prompt-words", str(prompt_words), "--measure", "--utility-steps", str(utility_steps), "--device", "cpu",
             home=home, threads=1, log=log)


def collect(home: Path, rows: list[Row]) -> list[dict[str, object]]:
    """The page's rows: each run's figures beside its corpus' measures."""
    client = mlflow_client(home)  # the store the page's commands logged to (its own, or MLFLOW_TRACKING_URI)
    found = []
    for row in rows:
        run_id, measured = trained_run(home, row), measures(home, row)
        if run_id is None or measured is None:
            continue
        data = client.get_run(run_id).data
        utility, leakage = measured["utility"], measured["leakage"]
        found.append({"mechanism": row.mechanism, "target_epsilon": row.target,
                      "epsilon": data.metrics.get("final_epsilon"), "unit": data.params.get("privacy_unit"),
                      "perplexity_test": data.metrics["perplexity_test"],
                      "synthetic_perplexity_real_test": utility["perplexity_real_test"],  # type: ignore[index]
                      "utility_run": utility["run_id"], "utility_steps": utility["steps"],  # type: ignore[index]
                      "run_id": run_id, "corpus": row.name, **{f"leakage_{k}": v for k, v in leakage.items()  # type: ignore[attr-defined]
                                                               if k not in ("dataset", "categories")}})
    return found


def _eps(value: object) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isinf(value)) else f"{float(value):.3g}"  # type: ignore[arg-type]


def results_page(out: Path, rows: list[dict[str, object]], base: ReutersBase, settings: dict[str, object]) -> None:
    before = base.before.get("eng.testb", next(iter(base.before.values()), math.nan))
    noiseless = next((r for r in rows if r["mechanism"] == "noiseless"), None)
    lines = [f"The start: {base.description}, treated as public. Perplexities count its BPE tokens, on CoNLL-2003's "
             f"real test file (eng.testb); the base scores **{before:.1f}** there before any fine-tuning.",
             f"Each corpus: {settings['count']} texts, each started by the first {settings['prompt_words']} words of a "
             f"Reuters-21578 sentence (public), at most 48 new tokens, temperature 1, top-p 0.95. Utility: a model from "
             f"the same base trained {settings['utility_steps']} steps on the corpus alone, noiselessly.", "",
             "## Utility: the corpus against the model it came from", "",
             "| mechanism | target epsilon | epsilon (its unit) | model's test perplexity | trained on its synthetic corpus "
             "| better than the base |",
             "|---|---:|---|---:|---:|---|"]
    for r in rows:
        unit = f"{_eps(r['epsilon'])} ({str(r['unit']).split(':')[0]})" if r["target_epsilon"] is not None else "none"
        synthetic = float(r["synthetic_perplexity_real_test"])  # type: ignore[arg-type]
        lines.append(f"| {r['mechanism']} | {_eps(r['target_epsilon'])} | {unit} | {float(r['perplexity_test']):.1f} "  # type: ignore[arg-type]
                     f"| {synthetic:.1f} | {'yes' if synthetic < before else 'no'} |")
    lines += ["", "## Leakage: what each corpus shares with the private training text", "",
              "Reference: as many sentences of the test split (held-out writers, never trained on). Figures are "
              "computed against the private text; uedp prints them to the curator and keeps them in the data home, "
              "never in MLflow (this page shows them because CoNLL-2003 is a public benchmark).", "",
              "| mechanism | target epsilon | distinct 5-grams in the train split (reference) | texts copying a train "
              "sentence of 4+ words (reference) | train entity surfaces found (reference) |",
              "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['mechanism']} | {_eps(r['target_epsilon'])} | {float(r['leakage_ngram_overlap']):.2%} "  # type: ignore[arg-type]
                     f"({float(r['leakage_ngram_overlap_reference']):.2%}) | {r['leakage_copied_sentences']} "  # type: ignore[arg-type]
                     f"({r['leakage_copied_sentences_reference']}) | {r['leakage_entity_surfaces']} "
                     f"({r['leakage_entity_surfaces_reference']}) |")
    if noiseless is not None:
        lines += ["", "Noiseless's corpus has no guarantee (uedp labels it \"no guarantee\" wherever it shows it): "
                      "it is the yardstick for both tables."]
    (out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "results.json").write_text(json.dumps({"base": asdict(base), "settings": settings, "rows": rows}, indent=1),
                                      encoding="utf-8")
    _figure(out, rows, before)


def _figure(out: Path, rows: list[dict[str, object]], before: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['mechanism']}\n" + (f"eps {_eps(r['target_epsilon'])}" if r["target_epsilon"] is not None else
                                       "no guarantee") for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4.2))
    ax.bar([x - 0.2 for x in xs], [float(r["perplexity_test"]) for r in rows], 0.4, label="the private model")  # type: ignore[arg-type]
    ax.bar([x + 0.2 for x in xs], [float(r["synthetic_perplexity_real_test"]) for r in rows], 0.4,  # type: ignore[arg-type]
           label="a model trained on its synthetic corpus")
    ax.axhline(before, color="grey", linestyle="--", label=f"the public base, not fine-tuned ({before:.0f})")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set(ylabel="perplexity on CoNLL's real test file (lower is better)",
           title="CoNLL-2003 from the Reuters base: the private model and its synthetic corpus")
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
    parser.add_argument("--base-home", type=Path, help="where the Reuters base is built or reused (default: "
                        "--home's base/)")
    parser.add_argument("--mechanisms", default="noiseless,dpsgd,userdp,uedp-bounded")
    parser.add_argument("--epsilons", default="2,8")
    parser.add_argument("--count", type=int, default=1000, help="texts per synthetic corpus")
    parser.add_argument("--prompt-words", type=int, default=2)
    parser.add_argument("--utility-steps", type=int, default=300, help="noiseless steps on each synthetic corpus")
    parser.add_argument("--workers", type=int, default=2, help="rows run side by side, one torch thread each")
    parser.add_argument("--page-only", action="store_true", help="rewrite the page from the runs in --home")
    args = parser.parse_args()
    started = time.perf_counter()
    home, log = args.home / "conll", args.home / "conll" / "commands.log"
    base_file = args.home / "reuters-base.json"
    rows = plan_rows(args.mechanisms.split(","), [float(e) for e in args.epsilons.split(",")])
    settings = {"count": args.count, "prompt_words": args.prompt_words, "utility_steps": args.utility_steps}
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.page_only:
        home.mkdir(parents=True, exist_ok=True)
        base = reuters_base(args.public_dir, args.base_home or args.home / "base",
                            [args.conll_dir / "eng.testb"], threads=1)
        base_file.write_text(json.dumps(asdict(base), indent=1), encoding="utf-8")
        files = [str(args.conll_dir / f) for f in ("eng.train", "eng.testa", "eng.testb")]
        uedp("ingest", "conll2003", *files, "--name", DATASET, home=home, threads=1, log=log)
        uedp("detect", DATASET, "--detector", "gold", home=home, threads=1, log=log)
        uedp("ingest", "reuters21578", str(args.public_dir / "reut2-000.sgm"), "--name", PROMPTS, home=home,
             threads=1, log=log)
        with ThreadPoolExecutor(args.workers) as pool:
            for done in [pool.submit(run_row, home, row, ReutersBase(**json.loads(base_file.read_text())), args.count,
                                     args.prompt_words, args.utility_steps) for row in rows]:
                done.result()
    base = ReutersBase(**json.loads(base_file.read_text(encoding="utf-8")))
    results_page(args.out, collect(home, rows), base, settings)
    if not args.page_only:
        write_command_file(args.out, (time.perf_counter() - started) / 60,
                           f"{args.workers} rows side by side, 1 torch thread each")
    print(f"wrote {args.out / 'results.md'}")


if __name__ == "__main__":
    main()
