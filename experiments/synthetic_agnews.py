"""The labelled synthetic-text page (``docs/results/synthetic-agnews``): a classifier trained on a corpus sampled
from a private model, scored on AG News' *real* test split, as the anchors measure one (Yue et al. 2023: DP
fine-tuning with the label as a control code, then a labelled corpus).

Every model fine-tunes a packaged public start (``--start smollm2``: ``uedp base smollm2`` in ``--base-home``,
LoRA adapters of ``--lora-rank``) on AG News' train items (``uedp ingest ag_news``, pseudo-writers of
``--items-per-user`` consecutive items, as the uedp-agnews page), each item read after its class' control
code (``--control-codes``): noiseless, then dpsgd, userdp and uedp-bounded at each target epsilon, the
user-level rows with the synthetic CoNLL page's settings. uedp-bounded's entities come from a spaCy NER trained
here on CoNLL-2003's gold tags (public text, no AG item).

From each model, ``uedp generate RUN --labels 1,2,3,4 --measure`` samples ``--count`` texts in equal shares of
the four classes (public proportions: nothing is read from the private labels to choose them), each after its
class' code, and trains a small classifier on them (``services.synthetic_accuracy``), scored on the real test
split beside the same classifier trained on the real train split: the ``real`` row, the yardstick (no
guarantee). The leakage figures stay in the data home and on this page, as on the CoNLL page.

    python experiments/synthetic_agnews.py --ag-dir /work/data/ag_news --conll-dir ../shared/data/conll2003 \\
        --start smollm2 --epsilons 8,3 --home /work/synth --base-home /work/smolhome

``--ag-dir`` holds train.csv and test.csv (class,title,description) or train.jsonl and test.jsonl ({text,
label}); uedp never downloads them. A rerun with the same ``--home`` skips finished trainings and measured
corpora, and ``--page-only`` rewrites the page from them. The discussion (``README.md``) is written by a person
from these figures.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from uedp.experiments.learning_results import ReutersBase, packaged_base, uedp
from uedp.experiments.page import write_command_file
from uedp.experiments.runs import mlflow_client
from uedp.experiments.synthetic_conll import (
    REAL,
    Row,
    epsilon_text,
    leakage_table,
    plan_rows,
    train_flags,
    trained_run,
)

DATASET = "agnews"
NER_TEXT = "conll-ner"  # CoNLL-2003, the NER's training text
LABELS = ("1", "2", "3", "4")  # AG News' classes: World, Sports, Business, Sci/Tech
CATEGORIES = "PERSON,LOC,ORG,MISC"  # what the CoNLL-trained NER finds
NEAR = {"dpsgd": 3.0, "userdp": 6.0}  # the issue's targets at epsilon 8: points below the noiseless corpus'


def labelled_flags(row: Row, utility_steps: int) -> list[str]:
    """``uedp train``'s flags for ``row`` on AG News: the CoNLL page's, each item read after its class' code."""
    return [*train_flags(row, utility_steps), "--control-codes"]


def measures(home: Path, row: Row) -> dict[str, Any] | None:
    file = home / "reports" / DATASET / f"synthetic-{row.name}.json"
    kept = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    return kept if "accuracy" in kept and "leakage" in kept else None


def run_row(home: Path, row: Row, base: ReutersBase, count: int, utility_steps: int, precision: str = "auto") -> None:
    """Train (unless finished), then generate and measure (unless measured). The real row is measured by every
    corpus' classifier measure (the real-train classifier is trained once): it trains nothing here."""
    if row.mechanism == REAL:
        return
    log = home / "commands.log"
    run_id = trained_run(home, row, DATASET)
    if run_id is None:
        out = uedp("train", DATASET, *labelled_flags(row, utility_steps), "--threads", "2", "--checkpoint-every",
                   "10", *base.flags(), "--precision", precision, home=home, threads=2, log=log)
        run_id = out.split("MLflow run: ")[1].split()[0]
    if measures(home, row) is None:
        uedp("generate", run_id, "--output", row.name, "--count", str(count), "--labels", ",".join(LABELS),
             "--measure", "--utility-steps", str(utility_steps), "--device", "cpu", home=home, threads=2, log=log)


def page_row(row: Row, start: str, run_id: str, metrics: dict[str, float], params: dict[str, str],
             measured: dict[str, Any]) -> dict[str, object]:
    """One row of results.json with the shared keys (``accuracy_real_test``: the corpus' classifier on the real
    test split), the generating run's figures, the real-train classifier's, and the corpus' leakage."""
    accuracy, leakage = measured["accuracy"], measured["leakage"]
    return {"corpus": DATASET, "mechanism": row.mechanism, "target_epsilon": row.target, "start": start,
            "seed": row.seed, "accuracy_real_test": accuracy["accuracy_real_test"], "run_id": run_id,
            "epsilon": metrics.get("final_epsilon"), "unit": params.get("privacy_unit"),
            "perplexity_test": metrics.get("perplexity_test"), "synthetic_dataset": row.name,
            "classifier_run": accuracy["run_id"], "classifier_steps": accuracy["steps"],
            "real_run": accuracy["real_run_id"], "real_accuracy_real_test": accuracy["real_accuracy_real_test"],
            **{f"leakage_{k}": v for k, v in leakage.items() if k not in ("dataset", "categories")}}


def real_rows(rows: list[dict[str, object]], start: str) -> list[dict[str, object]]:
    """The yardstick: the classifier trained on the real train split, as the corpora's measures found it (one
    run per seed of the classifier; every corpus of a seed names the same)."""
    seen: dict[object, dict[str, object]] = {}
    for r in rows:
        seen.setdefault(r["real_run"], {"corpus": DATASET, "mechanism": REAL, "target_epsilon": None, "start": start,
                                        "seed": r["seed"], "accuracy_real_test": r["real_accuracy_real_test"],
                                        "run_id": r["real_run"], "epsilon": None, "unit": "none"})
    return list(seen.values())


def collect(home: Path, rows: list[Row], start: str) -> list[dict[str, object]]:
    client = mlflow_client(home)
    found = []
    for row in rows:
        run_id, measured = (None, None) if row.mechanism == REAL else (trained_run(home, row, DATASET),
                                                                        measures(home, row))
        if run_id is None or measured is None:
            continue
        data = client.get_run(run_id).data
        found.append(page_row(row, start, run_id, data.metrics, data.params, measured))
    return real_rows(found, start) + found if any(r.mechanism == REAL for r in rows) else found


def points_below(rows: list[dict[str, object]], row: dict[str, object]) -> float | None:
    """How many accuracy points ``row``'s corpus is below the noiseless model's corpus of its seed (None where
    that corpus is not measured)."""
    noiseless = next((r for r in rows if r["mechanism"] == "noiseless" and r["seed"] == row["seed"]), None)
    if noiseless is None:
        return None
    return 100 * (float(noiseless["accuracy_real_test"]) - float(row["accuracy_real_test"]))  # type: ignore[arg-type]


def results_page(out: Path, rows: list[dict[str, object]], base: ReutersBase, settings: dict[str, object]) -> None:
    lines = [f"The start: {base.description}, treated as public. Each model reads an AG News item after its class' "
             f"control code; each corpus: {settings['count']} texts in equal shares of the {len(LABELS)} classes "
             "(public proportions), each sampled after its class' code. Accuracy: a small classifier "
             f"({settings['utility_steps']} noiseless steps) trained on the corpus alone, scored on AG News' real test "
             "split; the real row trains it on the real train split (no guarantee).", "",
             "| mechanism | target epsilon | seed | epsilon (its unit) | classifier's accuracy on the real test split "
             "| points below the noiseless model's corpus | the target |",
             "|---|---:|---:|---|---:|---:|---|"]
    for r in rows:
        unit = f"{epsilon_text(r['epsilon'])} ({str(r['unit']).split(':')[0]})" if r["target_epsilon"] is not None else "none"
        below = points_below(rows, r) if r["mechanism"] not in (REAL, "noiseless") else None
        bound = NEAR.get(str(r["mechanism"])) if r["target_epsilon"] == 8.0 else None
        target = "-" if bound is None or below is None else ("met" if below <= bound else "missed") + f" (<= {bound:g})"
        lines.append(f"| {'real train split (no corpus)' if r['mechanism'] == REAL else r['mechanism']} | "
                     f"{epsilon_text(r['target_epsilon'])} | {r['seed']} | {unit} | "
                     f"{float(r['accuracy_real_test']):.1%} | {'-' if below is None else f'{below:+.1f}'} | {target} |")  # type: ignore[arg-type]
    corpora = [r for r in rows if r["mechanism"] != REAL]
    lines += leakage_table(corpora, "Reference: as many items of the test split (never trained on). uedp keeps these "
                           "figures in the data home, never in MLflow (this page shows them because AG News is a "
                           "public benchmark).", "item")
    (out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "results.json").write_text(json.dumps({"base": asdict(base), "settings": settings, "rows": rows}, indent=1),
                                      encoding="utf-8")


def prepare(args: argparse.Namespace, home: Path) -> None:
    """The NER (CoNLL-2003's gold tags, public text), then AG News ingested and detected with it."""
    log = home / "commands.log"
    ner = home / "ner" / NER_TEXT
    if not (ner / "meta.json").is_file():
        conll = [str(args.conll_dir / f) for f in ("eng.train", "eng.testa", "eng.testb")]
        uedp("ingest", "conll2003", *conll, "--name", NER_TEXT, home=home, threads=2, log=log)
        uedp("ner", "train", NER_TEXT, "--out", str(ner), "--epochs", str(args.ner_epochs), home=home, threads=2,
             log=log)
    pairs = [args.ag_dir / f"{split}.{kind}" for kind in ("csv", "jsonl") for split in ("train", "test")]
    files = [p for p in pairs if p.suffix == (".csv" if (args.ag_dir / "train.csv").is_file() else ".jsonl")]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise SystemExit(f"--ag-dir {args.ag_dir}: {', '.join(missing)} not found (train.csv and test.csv, or "
                         "train.jsonl and test.jsonl)")
    uedp("ingest", "ag_news", *map(str, files), "--name", DATASET, "--users", f"chunk:{args.items_per_user}",
         home=home, threads=2, log=log)
    uedp("detect", DATASET, "--detector", "spacy", "--spacy-model", str(ner), home=home, threads=2, log=log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ag-dir", type=Path, required=True, help="AG News' train and test files")
    parser.add_argument("--conll-dir", type=Path, default=Path("../shared/data/conll2003"),
                        help="CoNLL-2003, the NER's training text")
    parser.add_argument("--out", type=Path, default=Path("docs/results/synthetic-agnews"))
    parser.add_argument("--home", type=Path, required=True, help="the page's data home (kept: a rerun goes on)")
    parser.add_argument("--base-home", type=Path, help="where the start is built or reused (default: --home's base/)")
    parser.add_argument("--start", choices=("smollm2",), default="smollm2", help="the packaged public start")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=96, help="tokens per item (code included)")
    parser.add_argument("--mechanisms", default=f"{REAL},noiseless,dpsgd,userdp,uedp-bounded")
    parser.add_argument("--epsilons", default="8,3")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--count", type=int, default=2000, help="texts per synthetic corpus")
    parser.add_argument("--utility-steps", type=int, default=300, help="noiseless steps of each corpus' models")
    parser.add_argument("--items-per-user", type=int, default=15)
    parser.add_argument("--ner-epochs", type=int, default=3)
    parser.add_argument("--precision", choices=("auto", "float32", "bf16"), default="auto",
                        help="every run's training forward pass (bf16: about 1.4x faster on a CPU with bf16 instructions)")
    parser.add_argument("--page-only", action="store_true", help="rewrite the page from the runs in --home")
    args = parser.parse_args()
    started = time.perf_counter()
    # runs are found again by mechanism, target and seed: a start of another length or rank gets a home of its own
    home = args.home / f"{DATASET}-{args.start}-len{args.max_len}-lora{args.lora_rank}"
    base_file = args.home / f"{args.start}-start-len{args.max_len}-lora{args.lora_rank}.json"
    rows = plan_rows(args.mechanisms.split(","), [float(e) for e in args.epsilons.split(",")],
                     [int(seed) for seed in args.seeds.split(",")])
    settings = {"count": args.count, "utility_steps": args.utility_steps, "items_per_user": args.items_per_user}
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.page_only:
        home.mkdir(parents=True, exist_ok=True)
        if not base_file.is_file():
            base = packaged_base(args.start, args.base_home or args.home / "base", [], args.max_len, args.lora_rank,
                                 threads=2)
            base_file.write_text(json.dumps(asdict(base), indent=1), encoding="utf-8")
        prepare(args, home)
        base = ReutersBase(**json.loads(base_file.read_text(encoding="utf-8")))
        for row in rows:  # one at a time: a 135M model's training takes both cores
            run_row(home, row, base, args.count, args.utility_steps, args.precision)
    base = ReutersBase(**json.loads(base_file.read_text(encoding="utf-8")))
    results_page(args.out, collect(home, rows, base.name), base, settings)
    if not args.page_only:
        write_command_file(args.out, (time.perf_counter() - started) / 60, "rows one after another")
    print(f"wrote {args.out / 'results.md'}")


if __name__ == "__main__":
    main()
