"""The "models that learn" results page: perplexity at epsilon 2 and 8 for noiseless, userdp, uedp-bounded,
dpsgd and selective, from scratch and from a public-pretrained start, beside the uniform and unigram
baselines, on two corpora of different kinds.

* **conll**: CoNLL-2003 (Reuters news). Its training documents are split in two halves by position: the
  first half is the *public* corpus the pretraining run sees, the second the private dataset. The public
  half is news of the same agency and period, so the gain it shows is an optimistic stand-in for a public
  corpus of the same domain.
* **messages**: made-up customer messages (``scripts/make_demo_corpus.py``), one user per writer; the
  public corpus is generated with other seeds (other writers, the same templates and shared entities).

Each corpus runs what a user runs in its own data home: ``uedp ingest`` (private and public), ``uedp
detect --detector gold``, a noiseless ``uedp train`` on the public corpus with ``--log-model``, then every
configuration with ``uedp train`` from scratch and with ``--init-from`` that run. Every setting not named
below is uedp's default (uedp-bounded's k is ``auto``); ``--q-user`` is lowered from the default 0.5 to keep
a run within a few minutes on 2 cores. The two corpora run side by side, one torch thread each.

A third start is **the Reuters base** (``--base``, on by default): the public base ``uedp pretrain`` builds
from Reuters-21578 (1987 newswire, disjoint from both corpora) with its own BPE vocabulary, the cpu
reproductions' base (GPT-2 small, 3000 steps; ``uedp.experiments.starts.BASES``). It is built once in
``--base-home`` (reused by content key: point it at a data home that already has it) and every
configuration runs again from it with ``--init-from`` its model folder and ``--tokenizer`` its vocabulary.
Its perplexities count BPE tokens, so they are compared with each other and with the base before
fine-tuning, never with the byte-level columns.

    python experiments/learning_results.py --conll-dir ../shared/data/conll2003 --out docs/results/learning

It writes ``results.md`` (both corpora), ``results.png`` and ``command.txt`` under ``--out``
(``results-base.*`` and ``command-base.txt`` with ``--starts base``); ``--home DIR --page-only`` rewrites
the page from an earlier run's data homes, and a run with ``--home`` of an interrupted one goes on where
it stopped. The page's discussion
(``README.md``) is written by a person from these figures.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from uedp.experiments.page import conll_page_parser, write_command_file
from uedp.experiments.runs import finished_runs

ROOT = Path(__file__).resolve().parents[1]
PRIVATE = ("userdp", "uedp-bounded", "dpsgd", "selective")
CATEGORIES = "PERSON,LOC,ORG,MISC"
STARTS = ("scratch", "public", "base")  # from scratch, the corpus' own public half, the Reuters base


@dataclass(frozen=True)
class ReutersBase:
    """The public start the pages fine-tune: its model and vocabulary folders, and its perplexity on each
    corpus' test file before any fine-tuning. ``name`` "base" is the Reuters base (``uedp pretrain``, a
    gpt2 small its runs start from with ``--init-from``); a packaged base (``uedp base smollm2``) is a
    checkpoint folder its runs load with ``--model FOLDER`` and adapt with LoRA of ``lora_rank``."""
    model_folder: str
    tokenizer_folder: str
    max_len: int
    description: str
    before: dict[str, float]
    name: str = "base"
    lora_rank: int = 0

    def flags(self) -> list[str]:
        if self.name != "base":
            return ["--model", self.model_folder, "--max-len", str(self.max_len),
                    *(["--lora-rank", str(self.lora_rank)] if self.lora_rank else [])]
        return ["--model", "gpt2", "--model-size", "small", "--init-from", self.model_folder,
                "--tokenizer", self.tokenizer_folder, "--max-len", str(self.max_len)]


def packaged_base(name: str, home: Path, test_files: Sequence[Path], max_len: int, lora_rank: int,
                  threads: int) -> ReutersBase:
    """A base ``uedp base NAME`` installs (fetched and converted once in ``home``), measured on each corpus'
    test file before fine-tuning, as the page's start."""
    home.mkdir(parents=True, exist_ok=True)
    out = uedp("base", name, *[a for f in test_files for a in ("--eval-file", str(f))], "--max-len", str(max_len),
               home=home, threads=threads, log=home / "commands.log")
    start = base_from_output(name, out, max_len, lora_rank)
    if start is None:
        raise SystemExit(f"uedp base {name} printed no folder; see {home / 'commands.log'}")
    return start


def page_start(start: str, base_file: Path, base_home: Path, public_dir: Path, test_files: Sequence[Path],
               max_len: int, lora_rank: int, threads: int) -> ReutersBase:
    """A page's start, kept in ``base_file``: the Reuters base (built or reused by content key in ``base_home``),
    or a packaged base, measured on ``test_files`` once (minutes for a 135M model) and read back after."""
    if start == "base":
        base = reuters_base(public_dir, base_home, test_files, threads=threads)
    elif base_file.is_file():
        base = ReutersBase(**json.loads(base_file.read_text(encoding="utf-8")))
    else:
        base = packaged_base(start, base_home, test_files, max_len, lora_rank, threads=threads)
    base_file.write_text(json.dumps(asdict(base), indent=1), encoding="utf-8")
    return base


def base_from_output(name: str, out: str, max_len: int, lora_rank: int) -> ReutersBase | None:
    """The start ``uedp base NAME`` printed: its folder, size and perplexity on each --eval-file (None when
    it printed no folder)."""
    built = re.search(r"^(.+?): ([0-9.]+)M parameters, ([0-9,]+)-token vocabulary, (?:reused|converted) in (.+)$",
                      out, re.M)
    if built is None:
        return None
    before = {m.group(1): float(m.group(2)) for m in
              re.finditer(r"^perplexity on (\S+) before fine-tuning: ([0-9.eE+]+) per token", out, re.M)}
    description = (f"{built.group(1)} ({built.group(2)}M parameters, {built.group(3)}-token vocabulary, `uedp base "
                   f"{name}`), LoRA adapters of rank {lora_rank}")
    return ReutersBase(built.group(4), built.group(4), max_len, description, before, name=name, lora_rank=lora_rank)


@dataclass(frozen=True)
class Corpus:
    name: str
    private: tuple[Path, ...]  # train, valid, test files
    public: tuple[Path, ...]
    q_user: float
    categories: str


def uedp(*args: str, home: Path, threads: int, log: Path) -> str:
    """Run one uedp command as a user would; its output is appended to the corpus' log and returned."""
    command = [os.environ.get("UEDP_BIN") or str(Path(sys.executable).with_name("uedp")), *args, "--home", str(home)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ uedp {' '.join(args)}\n{done.stdout}{done.stderr}\n")
    if done.returncode:
        raise SystemExit(f"uedp {' '.join(args)} failed ({done.returncode}); see {log}")
    print(f"[{home.name}] uedp {' '.join(args[:4])} ...", flush=True)
    return done.stdout


def conll_halves(conll_dir: Path, folder: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """CoNLL-2003's training documents split by position: (private files, public files)."""
    text = (conll_dir / "eng.train").read_text(encoding="utf-8")
    documents = [d for d in re.split(r"(?m)^-DOCSTART-[^\n]*\n", text) if d.strip()]
    half = len(documents) // 2
    folder.mkdir(parents=True, exist_ok=True)
    public, private = folder / "public.train", folder / "private.train"
    for path, part in ((public, documents[:half]), (private, documents[half:])):
        path.write_text("".join(f"-DOCSTART- -X- -X- O\n{d}" for d in part), encoding="utf-8")
    held_out = (conll_dir / "eng.testa", conll_dir / "eng.testb")
    return (private, *held_out), (public, *held_out)


def generated_messages(folder: Path, users: int) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """(private, public) message corpora: train/valid/test files from disjoint generator seeds."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[Path]] = {"private": [], "public": []}
    plan = (("private", "train", users, 21), ("private", "testa", 40, 22), ("private", "testb", 40, 23),
            ("public", "train", users, 31), ("public", "testa", 40, 32), ("public", "testb", 40, 33))
    for kind, split, count, seed in plan:
        path = folder / kind / f"messages.{split}"
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_demo_corpus.py"), "--users", str(count),
                        "--seed", str(seed), "--out", str(path)], check=True, capture_output=True)
        out[kind].append(path)
    return tuple(out["private"]), tuple(out["public"])


def run_id_of(output: str) -> str:
    return str(re.findall(r"MLflow run: (\w+)", output)[-1])


def reuters_base(public_dir: Path, home: Path, test_files: Sequence[Path], threads: int) -> ReutersBase:
    """Build (or reuse, by content key) the cpu reproductions' Reuters base in ``home`` with ``uedp pretrain``,
    measured on each corpus' test file."""
    from uedp.experiments.starts import BASES

    settings = BASES["cpu"]
    home.mkdir(parents=True, exist_ok=True)
    out = uedp("pretrain", str(public_dir), "--size", settings.size, "--steps", str(settings.steps),
               "--vocab-size", str(settings.vocab_size), "--batch-size", str(settings.batch_size),
               "--max-len", str(settings.max_len), "--threads", str(threads),
               *[a for f in test_files for a in ("--eval-file", str(f))], home=home, threads=threads,
               log=home / "commands.log")
    key = re.search(r"^base (\w+):", out, re.M)
    if key is None:
        raise SystemExit(f"uedp pretrain printed no base; see {home / 'commands.log'}")
    record = json.loads((home / "bases" / f"{key.group(1)}.json").read_text(encoding="utf-8"))
    description = (f"gpt2 {record['size']} ({record['parameters'] / 1e6:.1f}M parameters, {record['steps']:,} steps "
                   f"on Reuters-21578, BPE vocabulary of {settings.vocab_size:,} tokens)")
    return ReutersBase(record["model_folder"], record["tokenizer_folder"], settings.max_len, description,
                       {name: float(v) for name, v in record["held_out"].items()})


def run_corpus(corpus: Corpus, home: Path, epsilons: Sequence[float], pretrain_steps: int, threads: int,
               starts: Sequence[str], base: ReutersBase | None) -> None:
    """Everything one corpus needs from ``starts``, in its own data home (MLflow's store is not shared between
    corpora). A configuration already finished in the home is not trained again, so a page interrupted
    after an hour goes on where it stopped."""
    log = home / "commands.log"
    home.mkdir(parents=True, exist_ok=True)
    public = f"{corpus.name}-public"
    uedp("ingest", "conll2003", *map(str, corpus.private), "--name", corpus.name, home=home, threads=threads, log=log)
    uedp("detect", corpus.name, "--detector", "gold", home=home, threads=threads, log=log)
    common = ["--threads", str(threads), "--checkpoint-every", "0"]
    tiny = ["--model", "gpt2", "--model-size", "tiny"]
    flags: dict[str, list[str]] = {"scratch": tiny}
    if "public" in starts:
        uedp("ingest", "conll2003", *map(str, corpus.public), "--name", public, home=home, threads=threads, log=log)
        done = [r for r in corpus_runs(home, public) if r["mechanism"] == "noiseless"]
        pretrained = str(done[0]["run_id"]) if done else run_id_of(uedp(
            "train", public, "--mechanism", "noiseless", "--steps", str(pretrain_steps), "--log-model", *tiny,
            *common, home=home, threads=threads, log=log))
        flags["public"] = [*tiny, "--init-from", pretrained]
    if base is not None:
        flags["base"] = base.flags()
    for start in (s for s in STARTS if s in starts):
        finished = {(r["mechanism"], r["target"]) for r in corpus_runs(home, corpus.name) if r["start"] == start}
        for mechanism, target in [("noiseless", None), *((m, e) for m in PRIVATE for e in epsilons)]:
            if (mechanism, target) in finished:
                continue
            extra = ["--q-user", str(corpus.q_user)] if mechanism in ("userdp", "uedp-bounded") else []
            if mechanism in ("uedp-bounded", "selective"):
                extra += ["--categories", corpus.categories]
            budget = [] if target is None else ["--target-epsilon", f"{target:g}"]
            uedp("train", corpus.name, "--mechanism", mechanism, *budget, *extra, *common, *flags[start], home=home,
                 threads=threads, log=log)


def corpus_runs(home: Path, dataset: str) -> list[dict[str, Any]]:
    """The finished runs of ``dataset`` in a corpus' data home (the latest of each configuration)."""
    rows, seen = [], set()
    for run in finished_runs(home, dataset):
        params, metrics = run.data.params, run.data.metrics
        target = params.get("target_epsilon")
        started = params.get("init_from", "none").lower() not in ("none", "")
        start = "base" if params.get("tokenizer", "byte") != "byte" else "public" if started else "scratch"
        key = (params["mechanism"], target, start)
        if key in seen:
            continue
        seen.add(key)
        rows.append({
            "run_id": run.info.run_id, "mechanism": params["mechanism"], "start": start,
            "target": float(target) if target not in (None, "None") else None,
            "epsilon": metrics.get("final_epsilon", math.inf), "test": metrics["perplexity_test"],
            "uniform": metrics.get("perplexity_test_uniform_baseline", math.nan),
            "unigram": metrics.get("perplexity_test_unigram_baseline", math.nan),
            "ratio": float(params.get("noise_to_signal", "nan")),
            "k": (f"{float(params['privacy_holders_per_entity']):.0f}" if "privacy_holders_per_entity" in params
                  else None), "rounds": int(float(params.get("rounds_run", 0))),
            "planned": int(params.get("rounds") or int(params.get("steps", 0)) + int(params.get("public_steps", 0))),
            "seconds": (run.info.end_time - run.info.start_time) / 1000})
    return rows


def _cell(value: float) -> str:
    return f"{value:.1f}" if value < 1000 else f"{value:.2g}"


def _order(runs: list[dict[str, Any]]) -> list[tuple[str, float | None]]:
    targets = sorted({float(r["target"]) for r in runs if r["target"] is not None})
    return [("noiseless", None)] + [(m, e) for m in PRIVATE for e in targets]


def page_suffix(starts: Sequence[str]) -> str:
    """The page's files: ``results.md`` for a run with the byte-level starts, ``results-base.md`` (and
    ``-base`` figure and command) for one from the Reuters base alone, so each keeps its own command."""
    return "-base" if set(starts) == {"base"} else ""


def results_page(homes: dict[str, Path], out: Path, base: ReutersBase | None, starts: Sequence[str]) -> None:
    """``results.md``: per corpus, each configuration from scratch beside the corpus' public start, then the
    same configurations from the Reuters base (BPE tokens: a table of its own)."""
    lines: list[str] = []
    for name, home in homes.items():
        runs = [r for r in corpus_runs(home, name) if r["start"] in starts]
        if not runs:
            continue
        if not {"scratch", "public"} & set(starts):
            lines += _base_table(name, runs, base, level="##")
            continue
        by = {(r["mechanism"], r["target"], r["start"]): r for r in runs}
        reference = next(r for r in runs if r["mechanism"] == "noiseless" and r["start"] != "base")
        lines += [f"## {name}", "",
                  f"Baselines on the test split: uniform guess {float(reference['uniform']):.0f}, unigram fitted on "
                  f"the validation split {float(reference['unigram']):.1f}.", "",
                  "| mechanism | target epsilon | from scratch | public-pretrained start | gain | noise-to-signal "
                  "| k (auto) | learnt (below the unigram) |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]
        for mechanism, target in _order(runs):
            scratch, warm = by.get((mechanism, target, "scratch")), by.get((mechanism, target, "public"))
            if scratch is None and warm is None:
                continue
            shown = [r for r in (scratch, warm) if r is not None]
            learnt = ", ".join(("yes" if float(r["test"]) < float(r["unigram"]) else "no")
                               for r in shown)
            stopped = [r for r in shown if r["rounds"] < r["planned"]]
            gain = (f"{float(scratch['test']) / float(warm['test']):.2f}x" if scratch and warm else "-")
            ratio = shown[0]["ratio"]
            lines.append(
                f"| {mechanism} | {'-' if target is None else f'{target:g}'} | "
                f"{_cell(float(scratch['test'])) if scratch else '-'} | "
                f"{_cell(float(warm['test'])) if warm else '-'} | "
                f"{gain} | {'-' if math.isnan(float(ratio)) else f'{float(ratio):.3g}'} | "
                f"{shown[0]['k'] or '-'} | {learnt}{' (stopped: diverged)' if stopped else ''} |")
        lines.append("")
        lines += _base_table(name, runs, base)
    suffix = page_suffix(starts)
    (out / f"results{suffix}.md").write_text("\n".join(lines), encoding="utf-8")
    _plot(homes, out, base, starts, suffix)


def _base_table(name: str, runs: list[dict[str, Any]], base: ReutersBase | None,
                level: str = "###") -> list[str]:
    """The configurations from the Reuters base, against noiseless from it and the base before fine-tuning."""
    from_base = {(r["mechanism"], r["target"]): r for r in runs if r["start"] == "base"}
    noiseless = from_base.get(("noiseless", None))
    if base is None or noiseless is None:
        return []
    before = base.before[_test_file(name)]
    lines = [f"{level} {name} from the Reuters base", "",
             f"The start: {base.description}, treated as public. Perplexities count its BPE tokens (uniform guess "
             f"{float(noiseless['uniform']):.0f}), so they compare with each other, never with the byte-level tables "
             f"(results.md). Sentences of at most {base.max_len} tokens. Before fine-tuning the base scores "
             f"**{before:.1f}** on this test file.", "",
             "| mechanism | target epsilon | test perplexity | to noiseless from the base | better than the base "
             "before fine-tuning | noise-to-signal |",
             "|---|---:|---:|---:|---|---:|"]
    for mechanism, target in _order(runs):
        row = from_base.get((mechanism, target))
        if row is None:
            continue
        test, ratio = float(row["test"]), float(row["ratio"])
        stopped = " (stopped: diverged)" if row["rounds"] < row["planned"] else ""
        lines.append(f"| {mechanism} | {'-' if target is None else f'{target:g}'} | {_cell(test)} | "
                     f"{test / float(noiseless['test']):.2f}x | {'yes' if test < before else 'no'}{stopped} | "
                     f"{'-' if math.isnan(ratio) else f'{ratio:.3g}'} |")
    return [*lines, ""]


def _test_file(corpus: str) -> str:
    return "eng.testb" if corpus == "conll" else "messages.testb"


def _plot(homes: dict[str, Path], out: Path, base: ReutersBase | None, starts: Sequence[str], suffix: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corpora = [(name, [r for r in corpus_runs(home, name) if r["start"] in starts]) for name, home in homes.items()]
    corpora = [(name, runs) for name, runs in corpora if runs]
    with_base = base is not None and any(r["start"] == "base" for _, runs in corpora for r in runs)
    with_bytes = bool({"scratch", "public"} & set(starts))
    rows = int(with_bytes) + int(with_base)
    fig, axes = plt.subplots(rows, len(corpora), figsize=(6.5 * len(corpora), 5.2 * rows), dpi=120, squeeze=False)
    for column, (name, runs) in enumerate(corpora):
        labels: list[str] = []
        bars: dict[str, list[float]] = {start: [] for start in STARTS}
        for mechanism, target in _order(runs):
            pick = {r["start"]: float(r["test"]) for r in runs
                    if r["mechanism"] == mechanism and r["target"] == target}
            if not pick:
                continue
            shown = mechanism.replace("uedp-bounded", "uedp-\nbounded")  # fits under its bars
            labels.append(shown if target is None else f"{shown}\neps {target:g}")
            for start in STARTS:
                bars[start].append(pick.get(start, math.nan))
        x = range(len(labels))
        if with_bytes:
            ax = axes[0][column]
            ax.bar([i - 0.2 for i in x], bars["scratch"], 0.4, label="from scratch", color="C0")
            ax.bar([i + 0.2 for i in x], bars["public"], 0.4, label="public-pretrained start", color="C2")
            reference = next(r for r in runs if r["mechanism"] == "noiseless" and r["start"] != "base")
            ax.axhline(float(reference["uniform"]), color="0.3", linestyle="--", label="uniform guess")
            ax.axhline(float(reference["unigram"]), color="C3", linestyle=":", label="unigram (validation split)")
            ax.set(ylabel="test perplexity (byte tokens, log scale)", title=f"{name}: tiny GPT-2, lower is better")
            _finish(ax, labels)
        if with_base and base is not None:
            ax = axes[rows - 1][column]
            ax.bar(list(x), bars["base"], 0.5, label="from the Reuters base", color="C1")
            ax.axhline(base.before[_test_file(name)], color="0.3", linestyle="--",
                       label="the base before fine-tuning")
            ax.set(ylabel="test perplexity (BPE tokens, log scale)",
                   title=f"{name}: from the Reuters base (gpt2 small), lower is better")
            _finish(ax, labels)
    fig.tight_layout()
    fig.savefig(out / f"results{suffix}.png")
    plt.close(fig)


def _finish(ax: object, labels: list[str]) -> None:
    ax.set_yscale("log")  # type: ignore[attr-defined]
    ax.set_xticks(list(range(len(labels))), labels, fontsize=7)  # type: ignore[attr-defined]
    ax.grid(alpha=0.3, axis="y", which="both")  # type: ignore[attr-defined]
    ax.legend(fontsize=8)  # type: ignore[attr-defined]


def main() -> None:
    parser = conll_page_parser(__doc__, "docs/results/learning",
                               "folder for the data homes (default: a temporary one, removed)")
    parser.add_argument("--epsilons", default="2,8")
    parser.add_argument("--messages-users", type=int, default=300, help="writers per generated message corpus")
    parser.add_argument("--pretrain-steps", type=int, default=1000)
    parser.add_argument("--corpora", default="conll,messages")
    parser.add_argument("--page-only", action="store_true", help="rewrite the page from the data homes in --home")
    parser.add_argument("--starts", default=",".join(STARTS),
                        help="where the models start, comma-separated: scratch, public (the corpus' own public "
                             "half), base (the Reuters base); 'base' alone writes results-base.md, -base.png and "
                             "command-base.txt beside an earlier run's results.md")
    parser.add_argument("--public-dir", type=Path,
                        default=Path(os.environ.get("UEDP_REUTERS_DIR", "../shared/data/reuters21578")),
                        help="Reuters-21578's reut2-*.sgm files (default: $UEDP_REUTERS_DIR or "
                             "../shared/data/reuters21578)")
    parser.add_argument("--base-home", type=Path, help="data home where the base is built or reused "
                        "(default: --home's base/)")
    args = parser.parse_args()
    started = time.perf_counter()
    if missing := [p for p in ("eng.train", "eng.testa", "eng.testb") if not (args.conll_dir / p).is_file()]:
        parser.error(f"missing CoNLL-2003 files in {args.conll_dir}: {', '.join(missing)}")
    root = args.home or Path(tempfile.mkdtemp(prefix="uedp-learning-"))
    names = args.corpora.split(",")
    homes = {name: root / name for name in names}
    args.out.mkdir(parents=True, exist_ok=True)
    starts = args.starts.split(",")
    if unknown := set(starts) - set(STARTS):
        parser.error(f"--starts: unknown {', '.join(sorted(unknown))} (scratch, public, base)")
    suffix = page_suffix(starts)
    base_file = root / "reuters-base.json"  # the base the runs started from, for --page-only
    if args.page_only:
        base = ReutersBase(**json.loads(base_file.read_text(encoding="utf-8"))) if base_file.is_file() else None
        results_page(homes, args.out, base, starts)
        print(f"rewrote {args.out / f'results{suffix}.md'} from {root}")
        return
    if "base" in starts and not args.public_dir.is_dir():
        parser.error(f"--public-dir {args.public_dir}: no such folder (Reuters-21578's reut2-*.sgm), or leave "
                     "base out of --starts")
    try:
        corpora = []
        if "conll" in names:
            private, public = conll_halves(args.conll_dir, root / "files" / "conll")
            corpora.append(Corpus("conll", private, public, 0.1, CATEGORIES))
        if "messages" in names:
            private, public = generated_messages(root / "files" / "messages", args.messages_users)
            corpora.append(Corpus("messages", private, public, 0.2, CATEGORIES))
        epsilons = [float(e) for e in args.epsilons.split(",")]
        base = None
        if "base" in starts:
            base = reuters_base(args.public_dir, args.base_home or root / "base", [c.private[2] for c in corpora],
                                threads=2)
            base_file.write_text(json.dumps(asdict(base), indent=1), encoding="utf-8")
        with ThreadPoolExecutor(len(corpora)) as pool:
            for done in [pool.submit(run_corpus, c, homes[c.name], epsilons, args.pretrain_steps, 1, starts, base)
                         for c in corpora]:
                done.result()
        results_page(homes, args.out, base, starts)
        write_command_file(args.out, (time.perf_counter() - started) / 60,
                           "the corpora side by side, 1 torch thread each", name=f"command{suffix}.txt")
    finally:
        if args.home is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
