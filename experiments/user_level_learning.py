"""The user-level learning page (``docs/results/user-level-learning``): how close the user- and entity-level
mechanisms come to noiseless fine-tuning of a public base, before and after server optimizers and user-level DP-SGD.

Every configuration fine-tunes **the Reuters base** (``uedp pretrain`` on Reuters-21578, the cpu
reproductions' gpt2 small with its own BPE vocabulary, built once in ``--base-home`` and reused by content
key) on two corpora of different sizes in users:

* **conll**: CoNLL-2003's training file, one writer per document (946 writers); test on ``eng.testb``.
* **messages**: generated customer messages (``scripts/make_demo_corpus.py``), one writer per message
  thread, ``--messages-users`` writers (3,000 by default); its test file has writers of another seed.

Per corpus, seed and target epsilon:

* ``noiseless`` and ``dpsgd`` (example-level) at uedp's defaults;
* ``userdp`` and ``uedp-bounded`` **before**: the rule uedp had (DP-FedAvg: ``local_steps`` SGD steps per
  user, the noised mean applied with server learning rate 1);
* the same two **after**: user-level DP-SGD (``--local-update gradient``: one clipped gradient per sampled
  user, Adam on the noised mean), with the server learning rate and clip chosen by ``uedp tune`` on the
  Reuters corpus split into pseudo-writers (public text; the search never reads the corpora above), and
  ``--choose-sampling``'s split of the compute budget;
* ``uedp`` (users and entities) with the "after" rule.

Every user-level run gets the same compute budget, ``--budget-epochs`` user updates per writer (rounds
times expected users a round), so before and after differ only in what each user update is and how the
server applies it. Runs go in order of what the page needs most (epsilon 8 before 2, seed 0 before the
others), and a rerun with the same ``--home`` skips finished configurations, so an interrupted page goes on
where it stopped and ``--page-only`` writes what has finished.

    python experiments/user_level_learning.py --conll-dir ../shared/data/conll2003 \\
        --home /tmp/ull --base-home /tmp/ull/base

From SmolLM2-135M instead (``--start smollm2``: ``uedp base smollm2`` in ``--base-home``, LoRA adapters of
``--lora-rank``, each user's text as chunks of its consecutive sentences; the variant names both, e.g.
``after-lora8-chunks``), each start's runs in their own data homes under ``--home``:

    python experiments/user_level_learning.py --start smollm2 --user-text chunks --corpora conll \\
        --epsilons 8,3 --seeds 0 --home /tmp/ull --base-home /tmp/smolhome \\
        --out docs/results/user-level-smollm2

It writes ``results.md``, ``results.png``, ``results.json`` (one row per run: corpus, mechanism, variant,
start, target_epsilon, seed, perplexity_test, and the run's noise-to-signal) and ``command.txt`` under
``--out``. The page's discussion (``README.md``) is written by a person from these figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from uedp.experiments.learning_results import ReutersBase, page_start, uedp
from uedp.experiments.page import write_command_file
from uedp.experiments.runs import finished_runs

ROOT = Path(__file__).resolve().parents[1]
CATEGORIES = "PERSON,LOC,ORG,MISC"
USER_LEVEL = ("userdp", "uedp-bounded")
# The page's rows, in the order they run within a seed and epsilon (what the targets need first).
ROWS = (("userdp", "after"), ("uedp-bounded", "after"), ("userdp", "before"), ("uedp-bounded", "before"),
        ("dpsgd", ""), ("uedp", "after"))
# The order the page shows them: each rule's "before" beside its "after".
SHOWN = (("userdp", "before"), ("userdp", "after"), ("uedp-bounded", "before"), ("uedp-bounded", "after"),
         ("uedp", "after"), ("dpsgd", ""))
EPSILON_COLOURS = {2.0: "C0", 8.0: "C1"}
MIN_ROUNDS = 10  # the planner's floor (privacy.mechanisms.auto_sampling.MIN_ROUNDS)


@dataclass(frozen=True)
class Corpus:
    name: str
    files: tuple[Path, ...]  # train, valid, test
    writers: int

    @property
    def test_file(self) -> str:
        return self.files[2].name


@dataclass(frozen=True)
class Row:
    """One configuration of the page."""

    mechanism: str
    variant: str  # "before", "after", or "" for mechanisms without one
    target: float | None
    seed: int


def plan_rows(epsilons: Sequence[float], seeds: Sequence[int], variants: Sequence[str],
              mechanisms: Sequence[str] = ()) -> list[Row]:
    """Every configuration, most needed first: per seed, noiseless, then epsilon 8's rows before epsilon 2's."""
    mechanisms = mechanisms or ("noiseless", *(mechanism for mechanism, _ in ROWS))
    rows: list[Row] = []
    for seed in seeds:
        if "noiseless" in variants and "noiseless" in mechanisms:
            rows.append(Row("noiseless", "", None, seed))
        for target in sorted(epsilons, reverse=True):
            rows += [Row(m, v, target, seed) for m, v in ROWS if (v or m) in variants and m in mechanisms]
    return rows


def messages(folder: Path, writers: int) -> Corpus:
    """A generated message corpus of ``writers`` writers; valid and test files from other seeds' writers."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for split, count, seed in (("train", writers, 41), ("testa", 300, 42), ("testb", 300, 43)):
        path = folder / f"messages{writers}.{split}"
        if not path.is_file():
            subprocess.run([sys.executable, str(ROOT / "scripts" / "make_demo_corpus.py"), "--users", str(count),
                            "--seed", str(seed), "--out", str(path)], check=True, capture_output=True)
        files.append(path)
    return Corpus("messages", tuple(files), writers)


def conll(conll_dir: Path) -> Corpus:
    files = tuple(conll_dir / f for f in ("eng.train", "eng.testa", "eng.testb"))
    writers = sum(1 for line in files[0].open(encoding="utf-8") if line.startswith("-DOCSTART-"))
    return Corpus("conll", files, writers)


def sampling(corpus: Corpus, budget_epochs: float) -> tuple[float, int]:
    """The split of the budget into q_user and rounds: ``MIN_ROUNDS`` rounds of the largest cohort. That is
    the planner's choice at every budget and epsilon this page runs (``uedp epsilon --choose-sampling``
    prefers the largest cohort; its table is in the page's log), and the split the "before" rows use too,
    so before and after differ in the update rule alone."""
    return min(1.0, budget_epochs / MIN_ROUNDS), max(MIN_ROUNDS, round(budget_epochs))


def variant_label(rule: str, base: ReutersBase | None = None, user_text: str = "sentences") -> str:
    """The run's ``--variant``: its rule (before, after), then what else the page changed, so the shared rows
    name it: the LoRA rank of a packaged start, and the contribution rule when a user's text is chunked."""
    parts = [rule]
    if base is not None and base.lora_rank:
        parts.append(f"lora{base.lora_rank}")
    if user_text != "sentences":
        parts.append(user_text)
    return "-".join(parts)


def rule_of(variant: str) -> str:
    """A logged variant's rule (``after-lora8-chunks`` -> ``after``)."""
    return variant.split("-")[0]


def row_flags(row: Row, corpus: Corpus, budget_epochs: float, tuned_flags: Sequence[str],
              base: ReutersBase | None = None, user_text: str = "sentences") -> list[str]:
    flags = ["--mechanism", row.mechanism, "--seed", str(row.seed)]
    if row.target is not None:
        flags += ["--target-epsilon", f"{row.target:g}"]
    if row.mechanism in ("uedp-bounded", "uedp"):
        flags += ["--categories", CATEGORIES]
    if row.mechanism in (*USER_LEVEL, "uedp"):
        q_user, rounds = sampling(corpus, budget_epochs)
        flags += ["--q-user", f"{q_user:g}", "--rounds", str(rounds),
                  "--variant", variant_label(row.variant, base, user_text)]
        if user_text != "sentences":
            flags += ["--user-text", user_text]
        if row.variant == "after":
            flags += ["--local-update", "gradient", *tuned_flags]
    return flags


def tuned_flags_for(home: Path, key: str | None, homes: Sequence[Path]) -> list[str]:
    """How a corpus' "after" rows take the search ``key``: ``--tuned KEY`` where the search ran in its own
    data home (the run checks the proxy's lineage against its text and names the search), else the values
    it chose as plain flags (a search is recorded in one data home; the page says which corpus searched)."""
    if key is None:
        return []
    if (home / "tuned" / f"{key[:16]}.json").is_file():
        return ["--tuned", key]
    for other in homes:
        record = other / "tuned" / f"{key[:16]}.json"
        if record.is_file():
            chosen = json.loads(record.read_text(encoding="utf-8"))["chosen"]
            return [a for name, value in chosen.items() for a in (f"--{name.replace('_', '-')}", f"{value:g}")]
    raise SystemExit(f"--tuned {key}: no such search in any corpus' data home")


def run_corpus(corpus: Corpus, home: Path, rows: Sequence[Row], base: ReutersBase, budget_epochs: float,
               tuned: Sequence[str], threads: int, user_text: str = "sentences", precision: str = "auto") -> None:
    """Ingest, detect and run every row not finished yet, in the corpus' own data home."""
    log = home / "commands.log"
    home.mkdir(parents=True, exist_ok=True)
    uedp("ingest", "conll2003", *map(str, corpus.files), "--name", corpus.name, home=home, threads=threads, log=log)
    uedp("detect", corpus.name, "--detector", "gold", home=home, threads=threads, log=log)
    # A 135M-parameter start's run takes hours on a CPU: it saves resumable checkpoints; the Reuters base's none.
    common = ["--threads", str(threads), "--checkpoint-every", "0" if base.name == "base" else "10", *base.flags(),
              *(["--precision", precision] if precision != "auto" else [])]
    for row in rows:
        if row in finished_rows(home, corpus.name):
            continue
        uedp("train", corpus.name, *row_flags(row, corpus, budget_epochs, tuned, base, user_text), *common, home=home,
             threads=threads, log=log)


def runs_of(home: Path, dataset: str, start: str = "base") -> list[dict[str, object]]:
    """The finished runs of ``dataset`` in a corpus' data home, latest first, as the page's rows."""
    found, seen = [], set()
    for run in finished_runs(home, dataset):
        params, metrics = run.data.params, run.data.metrics
        if "perplexity_test" not in metrics:
            continue
        target = params.get("target_epsilon")
        variant = params.get("variant", "")
        row = Row(params["mechanism"], rule_of(variant),
                  float(target) if target not in (None, "None", "none") else None, int(params.get("seed", 0)))
        if row in seen:
            continue
        seen.add(row)
        ratio = float(params.get("noise_to_signal", "nan"))
        found.append({"corpus": dataset, "mechanism": row.mechanism, "variant": variant, "rule": row.variant,
                      "start": start,
                      "target_epsilon": row.target, "seed": row.seed,
                      "perplexity_test": metrics["perplexity_test"],
                      "epsilon": metrics.get("final_epsilon"), "noise_to_signal": None if math.isnan(ratio) else ratio,
                      "rounds_run": int(float(params.get("rounds_run", 0))) or None,
                      "server_lr": params.get("server_lr"), "clip": params.get("clip"),
                      "q_user": params.get("q_user"), "run_id": run.info.run_id,
                      "minutes": round((run.info.end_time - run.info.start_time) / 60000, 1)})
    return found


def finished_rows(home: Path, dataset: str) -> set[Row]:
    return {Row(str(r["mechanism"]), str(r["rule"]), r["target_epsilon"], int(r["seed"]))  # type: ignore[arg-type,call-overload]
            for r in runs_of(home, dataset)}


def _shown_rows(rows: list[dict[str, object]]) -> list[tuple[str, str]]:
    """The page's (mechanism, rule) pairs in ``SHOWN``'s order, then any other rule a run tried (e.g. a
    larger budget), so no finished run is left off the table."""
    found = {(str(r["mechanism"]), str(r["rule"])) for r in rows if r["mechanism"] != "noiseless"}
    return [p for p in SHOWN if p in found] + sorted(found - set(SHOWN))


def _number(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.2g}"


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    shown = _number(mean)
    return shown + (f" ± {statistics.stdev(values):.1f}" if len(values) > 1 and mean < 1000 else "") + \
        (f" (n={len(values)})" if len(values) != 3 else "")


def gain_kept(before: float, private: float, noiseless: float) -> float:
    """The share of noiseless fine-tuning's gain a private run keeps, in log perplexity:
    ``(log before - log private) / (log before - log noiseless)`` (1: all of it; 0: none; below 0: worse than the
    start). NaN when noiseless did not improve on the start."""
    gained = math.log(before) - math.log(noiseless)
    return (math.log(before) - math.log(private)) / gained if gained > 0 else math.nan


def results_page(homes: dict[str, Path], out: Path, base: ReutersBase, writers: dict[str, int]) -> None:
    """``results.json`` (every run) and ``results.md`` (mean over seeds, ratio to noiseless, the targets)."""
    rows = [r for name, home in homes.items() for r in runs_of(home, name, base.name)]
    for corpus in homes:  # each row's share of the noiseless gain, against its corpus' mean noiseless run
        mine = [r for r in rows if r["corpus"] == corpus]
        noiseless = [float(r["perplexity_test"]) for r in mine if r["mechanism"] == "noiseless"]  # type: ignore[arg-type]
        for r in mine:
            r["gain_kept"] = (round(gain_kept(base.before[_test_file(corpus, homes)], float(r["perplexity_test"]),  # type: ignore[arg-type]
                                              statistics.fmean(noiseless)), 4) if noiseless else None)
    (out / "results.json").write_text(json.dumps({"base": asdict(base), "rows": rows}, indent=1), encoding="utf-8")
    lines = [f"The start: {base.description}, treated as public. Perplexities count its BPE tokens. "
             "Mean over seeds (± standard deviation; n when not 3).", ""]
    for corpus in homes:
        mine = [r for r in rows if r["corpus"] == corpus]
        noiseless = [float(r["perplexity_test"]) for r in mine if r["mechanism"] == "noiseless"]  # type: ignore[arg-type]
        if not noiseless:
            continue
        reference = statistics.fmean(noiseless)
        before = base.before[_test_file(corpus, homes)]
        lines += [f"## {corpus} ({writers[corpus]:,} writers)", "",
                  f"The base scores **{before:.1f}** on this test file before fine-tuning; noiseless fine-tuning "
                  f"{_cell(noiseless)}.", "",
                  "| mechanism | rule | target epsilon | test perplexity | to noiseless | gain kept "
                  "| better than the base | noise-to-signal | server lr |", "|---|---|---:|---:|---:|---:|---|---:|---:|"]
        for target in sorted({float(r["target_epsilon"]) for r in mine if r["target_epsilon"] is not None},  # type: ignore[arg-type]
                             reverse=True):
            for mechanism, variant in _shown_rows(mine):
                picked = [r for r in mine if (r["mechanism"], r["rule"], r["target_epsilon"])
                          == (mechanism, variant, target)]
                if not picked:
                    continue
                values = [float(r["perplexity_test"]) for r in picked]  # type: ignore[arg-type]
                ratios = [float(r["noise_to_signal"]) for r in picked if r["noise_to_signal"] is not None]  # type: ignore[arg-type]
                mean = statistics.fmean(values)
                lines.append(f"| {mechanism} | {picked[0]['variant'] or '-'} | {target:g} | {_cell(values)} | "
                             f"{_number(mean / reference)}x | {gain_kept(before, mean, reference):.0%} | "
                             f"{'yes' if mean < before else 'no'} | "
                             f"{f'{statistics.fmean(ratios):.3g}' if ratios else '-'} | "
                             f"{picked[0]['server_lr'] or '-'} |")
        lines.append("")
    (out / "results.md").write_text("\n".join(lines), encoding="utf-8")
    _plot(rows, out, base, homes)


def _test_file(corpus: str, homes: dict[str, Path]) -> str:
    record = json.loads((homes[corpus] / "corpus.json").read_text(encoding="utf-8"))
    return str(record["test_file"])


def _plot(rows: list[dict[str, object]], out: Path, base: ReutersBase, homes: dict[str, Path]) -> None:
    """Per corpus, the ratio to noiseless of each mechanism and rule at each epsilon (log scale), with the
    base before fine-tuning and the issue's targets as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    corpora = [c for c in homes if any(r["corpus"] == c and r["mechanism"] == "noiseless" for r in rows)]
    if not corpora:
        return
    fig, axes = plt.subplots(1, len(corpora), figsize=(8.5 * len(corpora), 5), dpi=120, squeeze=False)
    for ax, corpus in zip(axes[0], corpora):
        mine = [r for r in rows if r["corpus"] == corpus]
        reference = statistics.fmean(float(r["perplexity_test"]) for r in mine if r["mechanism"] == "noiseless")  # type: ignore[arg-type]
        targets = sorted({float(r["target_epsilon"]) for r in mine if r["target_epsilon"] is not None})  # type: ignore[arg-type]
        shown = _shown_rows(mine)
        labels = [f"{m}\n{v}" if v else m for m, v in shown]
        width = 0.8 / max(1, len(targets))
        for i, target in enumerate(targets):
            heights = []
            for mechanism, variant in shown:
                values = [float(r["perplexity_test"]) for r in mine  # type: ignore[arg-type]
                          if (r["mechanism"], r["rule"], r["target_epsilon"]) == (mechanism, variant, target)]
                heights.append(statistics.fmean(values) / reference if values else math.nan)
            ax.bar([x + (i - (len(targets) - 1) / 2) * width for x in range(len(shown))], heights, width,
                   label=f"epsilon {target:g}", color=EPSILON_COLOURS.get(target, f"C{i + 2}"))
        ax.axhline(base.before[_test_file(corpus, homes)] / reference, color="0.3", linestyle="--",
                   label="the base before fine-tuning")
        ax.axhline(1.3, color="C3", linestyle=":", label="the userdp target (1.3x)")
        ax.set_yscale("log")
        ax.set_ylim(bottom=1)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xticks(range(len(shown)), labels, fontsize=8)
        ax.set(ylabel="test perplexity / noiseless from the base (log scale)",
               title=f"{corpus}: lower is better, 1 = noiseless")
        ax.grid(alpha=0.3, axis="y", which="both")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(out / "results.png")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conll-dir", type=Path, default=Path("../shared/data/conll2003"))
    parser.add_argument("--out", type=Path, default=Path("docs/results/user-level-learning"))
    parser.add_argument("--home", type=Path, required=True, help="folder for the corpora's data homes (kept, so "
                        "a rerun goes on where one stopped)")
    parser.add_argument("--base-home", type=Path, help="data home where the Reuters base is built or reused "
                        "(default: --home's base/)")
    parser.add_argument("--public-dir", type=Path,
                        default=Path(os.environ.get("UEDP_REUTERS_DIR", "../shared/data/reuters21578")))
    parser.add_argument("--corpora", default="conll,messages")
    parser.add_argument("--messages-users", type=int, default=3000, help="writers of the generated message corpus")
    parser.add_argument("--epsilons", default="2,8")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", default="noiseless,dpsgd,before,after",
                        help="which rows to run: noiseless, dpsgd, before, after (uedp runs with after)")
    parser.add_argument("--mechanisms", default="noiseless,dpsgd,userdp,uedp-bounded,uedp",
                        help="which mechanisms' rows to run (with --variants)")
    parser.add_argument("--budget-epochs", type=float, default=1.0,
                        help="user-level runs' compute budget: user updates per writer (rounds x q_user)")
    parser.add_argument("--tuned", help="a `uedp tune` search (its key) whose choice the after rows use: with --tuned "
                        "in the corpus whose data home holds it, as plain flags in the others")
    parser.add_argument("--start", default="base", help="what every run fine-tunes: base (the Reuters base, "
                        "`uedp pretrain`) or a packaged base (smollm2: `uedp base smollm2`, LoRA adapters)")
    parser.add_argument("--lora-rank", type=int, default=8, help="a packaged start's LoRA rank")
    parser.add_argument("--max-len", type=int, default=64, help="a packaged start's tokens per sequence")
    parser.add_argument("--user-text", choices=("sentences", "chunks"), default="sentences",
                        help="user-level rows: a sampled user's batches of sentences, or of chunks of its consecutive "
                        "sentences up to --max-len tokens (the variant names it)")
    parser.add_argument("--precision", choices=("auto", "float32", "bf16"), default="auto",
                        help="every run's training forward pass (bf16: about 1.4x faster from SmolLM2 on a CPU with "
                        "bf16 instructions)")
    parser.add_argument("--page-only", action="store_true", help="rewrite the page from the runs in --home")
    args = parser.parse_args()
    started = time.perf_counter()
    names = args.corpora.split(",")
    # Each start's runs in their own data homes: a finished row of one start is never taken for another's.
    homes = {name: args.home / (name if args.start == "base" else f"{name}-{args.start}") for name in names}
    args.out.mkdir(parents=True, exist_ok=True)
    base_file = args.home / ("reuters-base.json" if args.start == "base" else f"{args.start}-start.json")
    writers_file = args.home / "writers.json"
    if not args.page_only:
        corpora = [conll(args.conll_dir) if n == "conll" else messages(args.home / "files", args.messages_users)
                   for n in names]
        for corpus in corpora:
            homes[corpus.name].mkdir(parents=True, exist_ok=True)
            (homes[corpus.name] / "corpus.json").write_text(json.dumps({"test_file": corpus.test_file}))
        known = json.loads(writers_file.read_text(encoding="utf-8")) if writers_file.is_file() else {}
        writers_file.write_text(json.dumps(known | {c.name: c.writers for c in corpora}), encoding="utf-8")
        test_files = [c.files[2] for c in corpora]
        base = page_start(args.start, base_file, args.base_home or args.home / "base", args.public_dir, test_files,
                          args.max_len, args.lora_rank, threads=2)
        rows = plan_rows([float(e) for e in args.epsilons.split(",")], [int(s) for s in args.seeds.split(",")],
                         args.variants.split(","), args.mechanisms.split(","))
        with ThreadPoolExecutor(len(corpora)) as pool:
            for done in [pool.submit(run_corpus, c, homes[c.name], rows, base, args.budget_epochs,
                                     tuned_flags_for(homes[c.name], args.tuned, list(homes.values())),
                                     2 if len(corpora) == 1 else 1, args.user_text, args.precision)
                         for c in corpora]:
                done.result()
    base = ReutersBase(**json.loads(base_file.read_text(encoding="utf-8")))
    results_page(homes, args.out, base, json.loads(writers_file.read_text(encoding="utf-8")))
    if not args.page_only:
        write_command_file(args.out, (time.perf_counter() - started) / 60,
                           "the corpora side by side, 1 torch thread each" if len(names) > 1 else
                           "one corpus, 2 torch threads")
    print(f"wrote {args.out / 'results.md'}")


if __name__ == "__main__":
    main()
