"""The one-run audit results page: every auditable mechanism trained with m audit canaries at its own
privacy unit, then the accounted epsilon beside the audit's lower bound. One deliberately broken run
(DP-SGD whose noise is scaled by 1e-6 while its accountant reports the calibrated z) shows that the audit
can fail.

    python experiments/one_run_audit.py --corpus demo --out docs/results/one-run-audit
    python experiments/one_run_audit.py --corpus conll --conll-dir ../shared/data/conll2003 \
        --out docs/results/one-run-audit

``demo``: the bundled demo corpus (40 writers, gold entities), a tiny GPT-2 from scratch on CPU, every
auditable mechanism. ``conll``: CoNLL-2003 (946 documents as writers, gold PERSON/LOC/ORG/MISC) for the
user-level mechanisms at the settings of the uedp-bounded page (40 rounds, q_user = 0.05), where they learn.

Writes ``results-<corpus>.md`` (the table), ``audit_vs_epsilon-<corpus>.png`` and
``command-<corpus>.txt`` (command, machine, wall time) under ``--out``; the discussion (``README.md``)
is written by a person from these figures.
Every run is seeded (``randomness=seeded``) so the page can be reproduced; the seed is not a secret
here, which the audit does not use (it knows only the scores and the coins).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import platform
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

DIVERGED = 1e4  # a test perplexity above this: the model learned nothing usable (it cannot leak much either)
STEPS = {"steps": 600, "lr": 2e-3, "batch_size": 16}  # the batch the published page used (the default is now 32)
ROUNDS = {"rounds": 30, "q_user": 0.5}
# (label, mechanism, settings, broken): the runs of each corpus, baselines first.
CONLL_ROUNDS = {"rounds": 40, "q_user": 0.05}
CONLL_RUNS: list[tuple[str, str, dict[str, Any], bool]] = [
    ("userdp", "userdp", CONLL_ROUNDS | {"target_epsilon": 8.0}, False),
    ("uedp-bounded-k1", "uedp-bounded", CONLL_ROUNDS | {"target_epsilon": 8.0, "holders_per_entity": 1}, False),
]
DEMO_RUNS: list[tuple[str, str, dict[str, Any], bool]] = [
    ("noiseless", "noiseless", STEPS, False),
    ("deid", "deid", STEPS, False),
    ("dpsgd", "dpsgd", STEPS | {"target_epsilon": 0.5}, False),
    ("dpsgd", "dpsgd", STEPS | {"target_epsilon": 4.0}, False),
    ("dpsgd, noise x 1e-6 (broken)", "dpsgd", STEPS | {"target_epsilon": 0.5}, True),
    ("selective", "selective", STEPS | {"target_epsilon": 2.0, "public_steps": 300}, False),
    ("userdp", "userdp", ROUNDS | {"target_epsilon": 1.0}, False),
    ("userdp", "userdp", ROUNDS | {"target_epsilon": 8.0}, False),
    ("uedp", "uedp", ROUNDS | {"target_epsilon": 8.0}, False),
    ("uedp-bounded-k1", "uedp-bounded", ROUNDS | {"target_epsilon": 8.0, "holders_per_entity": 1}, False),
]


@contextlib.contextmanager
def broken_noise(active: bool) -> Iterator[None]:
    """DP-SGD's Gaussian noise scaled by 1e-6, the accountant untouched: a mechanism that lies."""
    import uedp.privacy.mechanisms.dpsgd as dpsgd

    real = dpsgd.noise_ahead  # type: ignore[attr-defined]  # the function the broken run patches
    if active:
        dpsgd.noise_ahead = lambda t, std, source: real(t, std * 1e-6, source)  # type: ignore[attr-defined,assignment]
    try:
        yield
    finally:
        dpsgd.noise_ahead = real  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("docs/results/one-run-audit"))
    parser.add_argument("--corpus", choices=("demo", "conll"), default="demo")
    parser.add_argument("--conll-dir", type=Path, default=Path("../shared/data/conll2003"))
    parser.add_argument("--canaries", type=int, default=128, help="audit canaries per run (m)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--home", type=Path, default=None, help="data home (default: a temporary one)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.services.audit_draw import load_for_run
    from uedp.services.config import TrainConfig
    from uedp.services.detect import detect_entities
    from uedp.services.launch import run_training
    from uedp.services.report import plot_audit, summarise
    from uedp.services.tracking import RunTracker
    from uedp.storage.home import DataHome
    from uedp.storage.ingest import IngestOptions, ingest

    started = time.time()
    with tempfile.TemporaryDirectory() as scratch:
        home = DataHome.from_env(args.home or Path(scratch) / "home")
        if args.corpus == "demo":
            files, runs, categories = [DEMO_CORPUS], DEMO_RUNS, {}
        else:
            files = [args.conll_dir / f"eng.{split}" for split in ("train", "testa", "testb")]
            runs, categories = CONLL_RUNS, {"categories": ["PERSON", "LOC", "ORG", "MISC"]}
        ingest(home, args.corpus, files, IngestOptions(format="conll2003"))
        detect_entities(home, args.corpus, DetectorConfig(detectors=["gold"]))
        rows, results = [], []
        for label, mechanism, settings, broken in runs:
            config = TrainConfig(dataset=args.corpus, mechanism=mechanism, randomness="seeded", checkpoint_every=0,  # type: ignore[call-arg]
                                 threads=args.threads, audit_canaries=args.canaries, **categories, **settings)
            began = time.time()
            with broken_noise(broken):
                result = replace(run_training(home, config), label=label)
            metrics = RunTracker.attach(home, result.run_id).client.get_run(result.run_id).data.metrics
            loaded = load_for_run(home, result.run_id)
            assert loaded is not None
            plan, record = loaded
            hosts = record.figures(plan.included) if record is not None else {}
            rows.append((label, plan.unit, plan.adjacency.replace("_", "/"), result.epsilon,
                         metrics.get("audit_one_run_epsilon_lower_bound", math.nan),
                         metrics.get("audit_one_run_clopper_pearson", math.nan),
                         f"{metrics.get('audit_one_run_correct', 0):.0f} / {metrics.get('audit_one_run_guesses', 0):.0f}",
                         sum(plan.included), hosts, result.utility_test, time.time() - began))
            results.append((result, settings.get("target_epsilon")))
            print(f"{label}: epsilon {result.epsilon:.3g}, audit bound {rows[-1][4]:.3g}", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"results-{args.corpus}.md").write_text(table(rows, args.canaries), encoding="utf-8")
        name = "demo corpus" if args.corpus == "demo" else "CoNLL-2003"
        plot_audit(summarise(results), args.out / f"audit_vs_epsilon-{args.corpus}.png",
                   f"{name}, tiny GPT-2, m = {args.canaries} canaries per run")
    corpus = f"--corpus {args.corpus}" + (f" --conll-dir {args.conll_dir}" if args.corpus == "conll" else "")
    (args.out / f"command-{args.corpus}.txt").write_text(
        f"python experiments/one_run_audit.py {corpus} --out {args.out} --canaries {args.canaries} "
        f"--threads {args.threads}\n"
        f"machine: {platform.machine()}, {platform.system()}, torch threads {args.threads}, CPU only\n"
        f"wall time: {time.time() - started:.0f} s\n", encoding="utf-8")


def table(rows: list[tuple[Any, ...]], m: int) -> str:
    def num(value: float) -> str:
        return "inf" if math.isinf(value) else "-" if math.isnan(value) else f"{value:.3g}"

    lines = [f"| run | canary unit | adjacency | accounted epsilon | audit bound (95%) | Clopper-Pearson | right / guessed "
             f"| planted of {m} | planted hosts' rounds (mean; never) | test perplexity | wall s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, unit, adjacency, epsilon, bound, cp, guesses, planted, hosts, ppl, wall in rows:
        taking = (f"{hosts['audit_host_rounds_mean']:.3g} of {hosts['audit_host_rounds_counted']:.0f}; "
                  f"{hosts['audit_host_never_sampled']:.0%}" if hosts else "every step (no Poisson sampling)"
                  if unit == "sequence" and math.isinf(epsilon) else "-")
        shown = f"{ppl:.4g}" + (" (diverged)" if not ppl < DIVERGED else "")
        lines.append(f"| {label} | {unit} | {adjacency} | {num(epsilon)} | {num(bound)} | {num(cp)} | {guesses} "
                     f"| {planted} | {taking} | {shown} | {wall:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
