"""Where private training stops learning: test perplexity against the noise-to-signal of one averaged update.

The planner's warning (`uedp epsilon`, `uedp train`; :mod:`privacy.signal`) fires past a threshold that
comes from this page. For each corpus it trains userdp (DP-FedAvg, server SGD) and dpsgd (Adam) from scratch
at several noise multipliers z, each a fixed noise-to-signal ratio (userdp: z / (q_user N); dpsgd: z / the
expected batch of 16), and compares the test perplexity with the two baselines every run now prints: a uniform
guess and a unigram model fitted on the validation split.

It runs what a user runs (``uedp ingest``, ``uedp detect --detector gold``, ``uedp train``) in its own data
home and writes ``results.md`` (one row per run) and ``command.txt`` under ``--out``:

    python experiments/noise_to_signal.py --conll-dir ../shared/data/conll2003 --out docs/results/noise-to-signal

The second corpus is generated here (``scripts/make_demo_corpus.py``: made-up customer messages, one user
per writer), so nothing is downloaded and no third-party text is committed.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from uedp.experiments.page import conll_page_parser, write_command_file
from uedp.experiments.runs import mlflow_client

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Corpus:
    name: str
    files: tuple[Path, ...]
    q_user: float
    rounds: int
    userdp_z: tuple[float, ...]
    dpsgd_z: tuple[float, ...]


def uedp(*args: str, home: Path, threads: int) -> str:
    """Run one uedp command as a user would; echo and return its output."""
    command = [os.environ.get("UEDP_BIN") or str(Path(sys.executable).with_name("uedp")), *args, "--home", str(home)]
    print("$ uedp " + " ".join(args), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    return done.stdout


def generated_messages(folder: Path) -> tuple[Path, ...]:
    """Train, validation and test files of made-up customer messages (disjoint generator seeds)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for split, users, seed in (("train", 300, 21), ("testa", 40, 22), ("testb", 40, 23)):
        path = folder / f"messages.{split}"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make_demo_corpus.py"), "--users", str(users),
                        "--seed", str(seed), "--out", str(path)], check=True, capture_output=True)
        files.append(path)
    return tuple(files)


def run_figures(home: Path, run_id: str) -> dict[str, float]:
    run = mlflow_client(home).get_run(run_id)
    metrics, params = run.data.metrics, run.data.params
    return {"test": metrics["perplexity_test"], "epsilon": metrics.get("final_epsilon", math.inf),
            "uniform": metrics.get("perplexity_test_uniform_baseline", math.nan),
            "unigram": metrics.get("perplexity_test_unigram_baseline", math.nan),
            "ratio": float(params.get("noise_to_signal", "nan")),
            "rounds": float(params.get("rounds_run", "nan")),
            "seconds": (run.info.end_time - run.info.start_time) / 1000}


def train(corpus: Corpus, mechanism: str, z: float, home: Path, threads: int) -> dict[str, float | str]:
    common = ["--model", "gpt2", "--model-size", "tiny", "--threads", str(threads), "--checkpoint-every", "0"]
    if mechanism == "userdp":
        extra = ["--rounds", str(corpus.rounds), "--q-user", str(corpus.q_user)]
    else:
        extra = ["--steps", "300", "--batch-size", "16"]  # the page's dpsgd rows: z / 16 (the default is now 32)
    output = uedp("train", corpus.name, "--mechanism", mechanism, "--noise-multiplier", f"{z:g}", *common, *extra,
                  home=home, threads=threads)
    run_id = re.findall(r"MLflow run: (\w+)", output)[-1]
    return {"corpus": corpus.name, "mechanism": mechanism, "z": z, **run_figures(home, run_id)}


def page(rows: list[dict[str, float | str]], out: Path) -> None:
    lines = ["| corpus | mechanism | z | noise-to-signal | epsilon | rounds run | test perplexity | unigram | uniform "
             "| learnt (below the unigram) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        test, unigram = float(r["test"]), float(r["unigram"])
        lines.append(f"| {r['corpus']} | {r['mechanism']} | {float(r['z']):g} | {float(r['ratio']):.3g} | "
                     f"{float(r['epsilon']):.3g} | {float(r['rounds']):.0f} | {test:.4g} | {unigram:.4g} | "
                     f"{float(r['uniform']):.4g} | {'yes' if test < unigram else 'no'} |")
    (out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    parser = conll_page_parser(__doc__, "docs/results/noise-to-signal",
                               "data home for the runs (default: a temporary folder, removed)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    started = time.perf_counter()
    conll = tuple(args.conll_dir / f"eng.{split}" for split in ("train", "testa", "testb"))
    if missing := [str(f) for f in conll if not f.is_file()]:
        parser.error(f"missing CoNLL-2003 files: {', '.join(missing)}")
    home = args.home or Path(tempfile.mkdtemp(prefix="uedp-noise-"))
    corpora = (
        # CoNLL: about 946 training users, q_user 0.05: z / 47 per averaged update
        Corpus("conll", conll, 0.05, 40, (0.5, 1.0, 1.5, 2.5, 4.0), (0.5, 1.6, 4.8)),
        # 300 generated writers (about 240 in the train split), q_user 0.2: z / 48
        Corpus("messages", generated_messages(home / "corpus"), 0.2, 40, (0.5, 1.0, 1.5, 2.5, 4.0), ()),
    )
    rows: list[dict[str, float | str]] = []
    try:
        for corpus in corpora:
            uedp("ingest", "conll2003", *map(str, corpus.files), "--name", corpus.name, home=home, threads=args.threads)
            uedp("detect", corpus.name, "--detector", "gold", home=home, threads=args.threads)
            for mechanism, zs in (("userdp", corpus.userdp_z), ("dpsgd", corpus.dpsgd_z)):
                rows.extend(train(corpus, mechanism, z, home, args.threads) for z in zs)
                args.out.mkdir(parents=True, exist_ok=True)
                page(rows, args.out)
        write_command_file(args.out, (time.perf_counter() - started) / 60, f"{args.threads} torch thread(s)")
    finally:
        if args.home is None:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
