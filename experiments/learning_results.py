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

    python experiments/learning_results.py --conll-dir ../shared/data/conll2003 --out docs/results/learning

It writes ``results.md`` (both corpora), ``results.png`` and ``command.txt`` under ``--out``;
``--home DIR --page-only`` rewrites the page from an earlier run's data homes. The page's discussion
(``README.md``) is written by a person from these figures.
"""

from __future__ import annotations

import argparse
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
from dataclasses import dataclass
from pathlib import Path

from page_files import write_command_file

ROOT = Path(__file__).resolve().parents[1]
PRIVATE = ("userdp", "uedp-bounded", "dpsgd", "selective")
CATEGORIES = "PERSON,LOC,ORG,MISC"


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
    return re.findall(r"MLflow run: (\w+)", output)[-1]


def run_corpus(corpus: Corpus, home: Path, epsilons: Sequence[float], pretrain_steps: int, threads: int) -> None:
    """Everything one corpus needs, in its own data home (MLflow's store is not shared between corpora)."""
    log = home / "commands.log"
    home.mkdir(parents=True, exist_ok=True)
    public = f"{corpus.name}-public"
    uedp("ingest", "conll2003", *map(str, corpus.private), "--name", corpus.name, home=home, threads=threads, log=log)
    uedp("ingest", "conll2003", *map(str, corpus.public), "--name", public, home=home, threads=threads, log=log)
    uedp("detect", corpus.name, "--detector", "gold", home=home, threads=threads, log=log)
    common = ["--model", "gpt2", "--model-size", "tiny", "--threads", str(threads), "--checkpoint-every", "0"]
    pretrained = run_id_of(uedp("train", public, "--mechanism", "noiseless", "--steps", str(pretrain_steps),
                                "--log-model", *common, home=home, threads=threads, log=log))
    for start in ((), ("--init-from", pretrained)):
        uedp("train", corpus.name, "--mechanism", "noiseless", *common, *start, home=home, threads=threads, log=log)
        for mechanism in PRIVATE:
            extra = ["--q-user", str(corpus.q_user)] if mechanism in ("userdp", "uedp-bounded") else []
            if mechanism in ("uedp-bounded", "selective"):
                extra += ["--categories", corpus.categories]
            for epsilon in epsilons:
                uedp("train", corpus.name, "--mechanism", mechanism, "--target-epsilon", f"{epsilon:g}", *extra,
                     *common, *start, home=home, threads=threads, log=log)


def corpus_runs(home: Path, dataset: str) -> list[dict[str, object]]:
    """The finished runs of ``dataset`` in a corpus' data home (the latest of each configuration)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{(home / 'mlflow.db').resolve()}")
    experiment = client.get_experiment_by_name(dataset)
    if experiment is None:
        return []
    rows, seen = [], set()
    for run in client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"]):
        if run.info.status != "FINISHED":
            continue
        params, metrics = run.data.params, run.data.metrics
        target = params.get("target_epsilon")
        key = (params["mechanism"], target, params.get("init_from", "none").lower() not in ("none", ""))
        if key in seen:
            continue
        seen.add(key)
        rows.append({
            "mechanism": params["mechanism"], "pretrained": key[2],
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


def results_page(homes: dict[str, Path], out: Path) -> None:
    """``results.md``: per corpus, each configuration from scratch beside the pretrained start."""
    lines: list[str] = []
    panels = []
    for name, home in homes.items():
        runs = corpus_runs(home, name)
        if not runs:
            continue
        by = {(r["mechanism"], r["target"], r["pretrained"]): r for r in runs}
        base = next(r for r in runs if r["mechanism"] == "noiseless")
        lines += [f"## {name}", "",
                  f"Baselines on the test split: uniform guess {float(base['uniform']):.0f}, unigram fitted on the "
                  f"validation split {float(base['unigram']):.1f}.", "",
                  "| mechanism | target epsilon | from scratch | public-pretrained start | gain | noise-to-signal "
                  "| k (auto) | learnt (below the unigram) |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]
        order = [("noiseless", None)] + [(m, e) for m in PRIVATE for e in sorted({r["target"] for r in runs
                                                                                  if r["target"] is not None})]
        for mechanism, target in order:
            scratch, warm = by.get((mechanism, target, False)), by.get((mechanism, target, True))
            if scratch is None and warm is None:
                continue
            shown = [r for r in (scratch, warm) if r is not None]
            tests = [float(r["test"]) for r in shown]  # type: ignore[arg-type]
            learnt = ", ".join(("yes" if float(r["test"]) < float(r["unigram"]) else "no")  # type: ignore[arg-type]
                               for r in shown)
            stopped = [r for r in shown if r["rounds"] < r["planned"]]  # type: ignore[operator]
            gain = (f"{float(scratch['test']) / float(warm['test']):.2f}x" if scratch and warm else "-")
            ratio = shown[0]["ratio"]
            lines.append(
                f"| {mechanism} | {'-' if target is None else f'{target:g}'} | "
                f"{_cell(float(scratch['test'])) if scratch else '-'} | {_cell(float(warm['test'])) if warm else '-'} | "
                f"{gain} | {'-' if math.isnan(float(ratio)) else f'{float(ratio):.3g}'} | "  # type: ignore[arg-type]
                f"{shown[0]['k'] or '-'} | {learnt}{' (stopped: diverged)' if stopped else ''} |")
            panels.append((name, mechanism, target, tests))
        lines.append("")
    (out / "results.md").write_text("\n".join(lines), encoding="utf-8")
    _plot(homes, out)


def _plot(homes: dict[str, Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corpora = [(name, corpus_runs(home, name)) for name, home in homes.items()]
    corpora = [(name, runs) for name, runs in corpora if runs]
    fig, axes = plt.subplots(1, len(corpora), figsize=(6.5 * len(corpora), 5.2), dpi=120, squeeze=False)
    for ax, (name, runs) in zip(axes[0], corpora):
        labels, scratch, warm = [], [], []
        for mechanism in ("noiseless", *PRIVATE):
            for target in sorted({r["target"] for r in runs if r["mechanism"] == mechanism},
                                 key=lambda t: -1 if t is None else t):  # type: ignore[arg-type,operator]
                pick = {r["pretrained"]: float(r["test"]) for r in runs  # type: ignore[arg-type]
                        if r["mechanism"] == mechanism and r["target"] == target}
                shown = mechanism.replace("uedp-bounded", "uedp-\nbounded")  # fits under its bars
                labels.append(shown if target is None else f"{shown}\neps {target:g}")
                scratch.append(pick.get(False, math.nan))
                warm.append(pick.get(True, math.nan))
        x = range(len(labels))
        ax.bar([i - 0.2 for i in x], scratch, 0.4, label="from scratch", color="C0")
        ax.bar([i + 0.2 for i in x], warm, 0.4, label="public-pretrained start", color="C2")
        base = next(r for r in runs if r["mechanism"] == "noiseless")
        ax.axhline(float(base["uniform"]), color="0.3", linestyle="--", label="uniform guess")  # type: ignore[arg-type]
        ax.axhline(float(base["unigram"]), color="C3", linestyle=":", label="unigram (validation split)")  # type: ignore[arg-type]
        ax.set_yscale("log")
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.set(ylabel="test perplexity (byte tokens, log scale)", title=f"{name}: tiny GPT-2, lower is better")
        ax.grid(alpha=0.3, axis="y", which="both")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "results.png")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conll-dir", type=Path, required=True, help="folder with eng.train, eng.testa, eng.testb")
    parser.add_argument("--out", type=Path, default=Path("docs/results/learning"))
    parser.add_argument("--home", type=Path, help="folder for the data homes (default: a temporary one, removed)")
    parser.add_argument("--epsilons", default="2,8")
    parser.add_argument("--messages-users", type=int, default=300, help="writers per generated message corpus")
    parser.add_argument("--pretrain-steps", type=int, default=1000)
    parser.add_argument("--corpora", default="conll,messages")
    parser.add_argument("--page-only", action="store_true", help="rewrite the page from the data homes in --home")
    args = parser.parse_args()
    started = time.perf_counter()
    if missing := [p for p in ("eng.train", "eng.testa", "eng.testb") if not (args.conll_dir / p).is_file()]:
        parser.error(f"missing CoNLL-2003 files in {args.conll_dir}: {', '.join(missing)}")
    root = args.home or Path(tempfile.mkdtemp(prefix="uedp-learning-"))
    names = args.corpora.split(",")
    homes = {name: root / name for name in names}
    args.out.mkdir(parents=True, exist_ok=True)
    if args.page_only:
        results_page(homes, args.out)
        print(f"rewrote {args.out / 'results.md'} from {root}")
        return
    try:
        corpora = []
        if "conll" in names:
            private, public = conll_halves(args.conll_dir, root / "files" / "conll")
            corpora.append(Corpus("conll", private, public, 0.1, CATEGORIES))
        if "messages" in names:
            private, public = generated_messages(root / "files" / "messages", args.messages_users)
            corpora.append(Corpus("messages", private, public, 0.2, CATEGORIES))
        epsilons = [float(e) for e in args.epsilons.split(",")]
        with ThreadPoolExecutor(len(corpora)) as pool:
            for done in [pool.submit(run_corpus, c, homes[c.name], epsilons, args.pretrain_steps, 1) for c in corpora]:
                done.result()
        results_page(homes, args.out)
        write_command_file(args.out, (time.perf_counter() - started) / 60,
                           "the corpora side by side, 1 torch thread each")
    finally:
        if args.home is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
