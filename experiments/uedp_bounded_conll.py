"""The uedp-bounded results page: CoNLL-2003 with gold entities, a small GPT-2 trained from scratch on
CPU, noiseless / deid / userdp / uedp / uedp-bounded at k = 1, 4, 16, two target epsilons, two seeds.

It runs what a user runs (``uedp ingest``, ``uedp detect --detector gold``, one ``uedp sweep`` with
``--grid holders_per_entity=...``) in its own data home, then writes under ``--out``:

* ``results.md`` and ``results.png``: per mechanism and target epsilon, the accounted epsilon, test
  perplexity (mean and range over seeds), the share of training sentences used and the wall time per
  run (from MLflow's start and end times of each run);
* ``holders.md``: the share of sentences each k keeps (every holder strategy), and uedp's expected share
  per round under its AND rule, both computed from the corpus' attribution graph;
* ``command.txt``: the command, the machine and the total wall time.

    python experiments/uedp_bounded_conll.py --conll-dir ../shared/data/conll2003 \\
        --out docs/results/uedp-bounded-conll [--rounds 40] [--epsilons 2,8] [--seeds 0,1] [--k 1,4,16]

``--home DIR --page-only`` rewrites the page from the latest sweep in DIR without training again.

The page's discussion (``README.md`` beside these files) is written by a person from these figures.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from uedp.experiments.page import conll_page_parser, write_command_file
from uedp.experiments.runs import mlflow_client

CATEGORIES = "PERSON,LOC,ORG,MISC"


def uedp(*args: str, home: Path, threads: int) -> None:
    """Run one uedp command as a user would; its output goes to this terminal."""
    command = [str(Path(sys.executable).with_name("uedp")), *args, "--home", str(home)]
    print("$ " + " ".join(command[1:]), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run(command, check=True, env=env)


def holder_table(home: Path, ks: list[int], q_entity: float, q_extended: float) -> str:
    """The holder choice on the graph the runs trained on: the ingested train split's entity sets, read
    as training reads them."""
    from uedp.privacy.attribution import HOLDER_CHOICES, AttributionGraph, choose_holders
    from uedp.services.config import TrainConfig
    from uedp.services.training_data import load_training_texts
    from uedp.storage.catalog import Catalog
    from uedp.storage.home import DataHome

    config = TrainConfig(dataset="conll", mechanism="uedp-bounded", noise_multiplier=1.0,  # type: ignore[call-arg]
                         categories=CATEGORIES.split(","))
    with Catalog(DataHome(home), "conll") as catalog:
        graph = AttributionGraph.from_entity_sets(load_training_texts(catalog, config).entities)
    strategies = [s for s in HOLDER_CHOICES if s != "best"]
    lines = [f"# Holder choice on the train split (gold {CATEGORIES})", "",
             f"{len(graph.users)} users, {graph.n_sentences} sentences, {graph.n_sensitive} with an entity, "
             f"{graph.n_entities} entities (identified by where they occur). Share of the sentences with an "
             "entity that each strategy keeps; `best` (the default) takes the best of them. Sentences without an "
             "entity are always kept.", "",
             "| k | " + " | ".join(strategies) + " | data used (best) |", "|---:|" + "---:|" * (len(strategies) + 1)]
    for k in ks:
        results = {s: choose_holders(graph, k, s) for s in strategies}  # type: ignore[arg-type]
        best = max(results.values(), key=lambda r: r.sensitive_kept)
        used = (best.sensitive_kept + graph.n_plain) / graph.n_sentences
        lines.append(f"| {k} | " + " | ".join(f"{r.sensitive_kept / graph.n_sensitive:.1%}" for r in results.values())
                     + f" | {used:.1%} |")
    # uedp (AND rule): a sampled user trains on a sentence with entity set E with probability q_e^|E|,
    # on a sentence without an entity with probability q_s.
    expected = sum(q_entity ** len(ids) if ids else q_extended for user in graph.sentences for ids in user)
    lines += ["", f"uedp trains a sampled user on each sentence whose entities were all sampled (q_entity = "
              f"{q_entity:g} each) and on each sentence without an entity that was sampled (q_extended = "
              f"{q_extended:g}): in expectation {expected / graph.n_sentences:.1%} of a sampled user's sentences "
              "per round."]
    return "\n".join(lines) + "\n"


def sweep_runs(home: Path) -> list[dict[str, object]]:
    """The latest sweep's runs in the data home's MLflow store, one dict per run."""
    client = mlflow_client(home)
    experiments = [e.experiment_id for e in client.search_experiments()]
    parents = client.search_runs(experiments, "tags.`uedp.kind` = 'sweep'", order_by=["attributes.start_time DESC"],
                                 max_results=1)
    if not parents:
        raise SystemExit(f"no sweep in {home}")
    children = client.search_runs(experiments, f"tags.`mlflow.parentRunId` = '{parents[0].info.run_id}'",
                                  max_results=1000)
    runs = []
    for run in children:
        if run.info.status != "FINISHED":
            continue
        params, metrics = run.data.params, run.data.metrics
        target = params.get("target_epsilon")
        runs.append({
            "label": run.info.run_name.split("-gpt2-")[0], "seed": int(params["seed"]),
            "target": float(target) if target not in (None, "None") else None,
            "epsilon": metrics.get("final_epsilon", math.inf), "test": metrics["perplexity_test"],
            "data_share": float(params["privacy_data_share_used"]) if "privacy_data_share_used" in params else None,
            "z": float(params["noise_multiplier_used"]) if "noise_multiplier_used" in params else None,
            "seconds": (run.info.end_time - run.info.start_time) / 1000})
    return runs


ORDER = ("noiseless", "deid", "userdp", "uedp", "uedp-bounded")


def _order(label: str) -> tuple[int, int, str]:
    base = next((i for i, name in reversed(list(enumerate(ORDER))) if label.startswith(name)), len(ORDER))
    k = int(label.rsplit("-k", 1)[1]) if "-k" in label and label.rsplit("-k", 1)[1].isdigit() else 0
    return base, k, label


def results_page(runs: list[dict[str, object]], out: Path) -> None:
    """``results.md`` (the table) and ``results.png`` (perplexity against epsilon; wall time per run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, float | None], list[dict[str, object]]] = {}
    for run in runs:
        groups.setdefault((str(run["label"]), run["target"]), []).append(run)  # type: ignore[arg-type]
    keys = sorted(groups, key=lambda key: (_order(key[0]), key[1] or 0.0))

    def shown(ppl: float) -> str:  # beyond a uniform guess (257) the model has diverged: say so, briefly
        return f"{ppl:.1f}" if ppl < 1000 else f"{ppl:.1e} (diverged)"

    lines = ["| mechanism | target epsilon | accounted epsilon | z | test perplexity (mean) | range over seeds "
             "| data used | wall time per run | seeds |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = []
    for label, target in keys:
        group = groups[(label, target)]
        tests = [float(r["test"]) for r in group]  # type: ignore[arg-type]
        epsilon = statistics.fmean(float(r["epsilon"]) for r in group)  # type: ignore[arg-type]
        share = group[0]["data_share"]
        zs = [float(r["z"]) for r in group if r["z"] is not None and math.isfinite(epsilon)]  # type: ignore[arg-type]
        seconds = statistics.fmean(float(r["seconds"]) for r in group)  # type: ignore[arg-type]
        rows.append((label, target, epsilon, statistics.fmean(tests), seconds))
        lines.append(f"| {label} | {'-' if target is None else f'{target:g}'} | "
                     f"{'inf' if not math.isfinite(epsilon) else f'{epsilon:.3g}'} | "
                     f"{f'{statistics.fmean(zs):.3g}' if zs else '-'} | {shown(statistics.fmean(tests))} | "
                     f"{shown(min(tests))} - {shown(max(tests))} | {'all' if share is None else f'{share:.1%}'} | "
                     f"{seconds:.0f} s | {len(group)} |")
    (out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.6), dpi=120, gridspec_kw={"width_ratios": [3, 2]})
    labels = sorted({r[0] for r in rows}, key=_order)
    ceiling = 1000.0  # perplexities above are drawn on the ceiling as triangles (diverged)
    for index, label in enumerate(labels):
        points = sorted((r[2], r[3]) for r in rows if r[0] == label)
        color = f"C{index}"
        if all(math.isfinite(p[0]) for p in points):
            cap = ceiling * 0.9 ** index  # diverged mechanisms side by side under the ceiling, not on top of each other
            left.plot([p[0] for p in points], [min(p[1], cap) for p in points], color=color, label=label)
            for x, y in points:
                left.plot(x, min(y, cap), marker="^" if y > cap else "o", color=color, markersize=7)
        else:
            left.axhline(points[0][1], linestyle="--", color=color, label=f"{label} (no guarantee)")
    left.axhspan(257, ceiling * 1.15, color="0.9", zorder=0)
    left.text(2.05, 300, "worse than a uniform guess (257); triangles: diverged, far off the scale", fontsize=7)
    left.set_ylim(8, ceiling * 1.15)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xticks([2, 4, 8])
    left.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    left.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
    left.get_yaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    left.set(xlabel="accounted epsilon (delta 1e-5; each mechanism's own unit)",
             ylabel="test perplexity (byte tokens; 257 = uniform)",
             title="CoNLL-2003, tiny GPT-2 from scratch: utility vs epsilon")
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=4)
    per_label = [statistics.fmean(r[4] for r in rows if r[0] == label) / 60 for label in labels]
    right.barh(labels, per_label, color=[f"C{i}" for i in range(len(labels))])
    right.invert_yaxis()
    right.set(xlabel="wall time per run (minutes, 1 CPU thread)", title="cost per run")
    right.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(out / "results.png")
    plt.close(fig)


def main() -> None:
    parser = conll_page_parser(__doc__, "docs/results/uedp-bounded-conll",
                               "data home for the runs (default: a temporary folder, removed)")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--q-user", type=float, default=0.05)
    parser.add_argument("--noiseless-steps", type=int, default=1000)
    parser.add_argument("--epsilons", default="2,8")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--k", default="1,4,16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--page-only", action="store_true", help="rewrite the page from the latest sweep in --home")
    args = parser.parse_args()
    started = time.perf_counter()
    files = [args.conll_dir / f"eng.{split}" for split in ("train", "testa", "testb")]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        parser.error(f"missing CoNLL-2003 files: {', '.join(missing)}")
    ks = [int(k) for k in args.k.split(",")]
    if args.page_only:
        if args.home is None:
            parser.error("--page-only needs the --home of an earlier run")
        args.out.mkdir(parents=True, exist_ok=True)
        results_page(sweep_runs(args.home), args.out)
        (args.out / "holders.md").write_text(holder_table(args.home, ks, 0.5, 0.5), encoding="utf-8")
        print(f"rewrote {args.out / 'results.md'} and results.png from {args.home}")
        return
    home = args.home or Path(tempfile.mkdtemp(prefix="uedp-bounded-"))
    try:
        uedp("ingest", "conll2003", *map(str, files), "--name", "conll", home=home, threads=args.threads)
        uedp("detect", "conll", "--detector", "gold", home=home, threads=args.threads)
        sweep = ["sweep", "conll", "--mechanisms", "noiseless,deid,userdp,uedp,uedp-bounded", "--categories", CATEGORIES,
                 "--epsilons", args.epsilons, "--seeds", args.seeds, "--grid", f"holders_per_entity={args.k}",
                 "--model", "gpt2", "--model-size", "tiny", "--rounds", str(args.rounds), "--q-user", str(args.q_user),
                 "--steps", str(args.noiseless_steps), "--batch-size", "16", "--threads", str(args.threads), "--checkpoint-every", "0"]
        uedp(*sweep, home=home, threads=args.threads)
        args.out.mkdir(parents=True, exist_ok=True)
        results_page(sweep_runs(home), args.out)
        (args.out / "holders.md").write_text(holder_table(home, ks, 0.5, 0.5), encoding="utf-8")
        write_command_file(args.out, (time.perf_counter() - started) / 60, f"{args.threads} torch thread(s)",
                           f"sweep: uedp {' '.join(sweep)}")
    finally:
        if args.home is None:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
