"""``uedp reproduce``: the seed papers' experiments, one command each, at three scales.

* ``ci``: the first documents of each file of the corpus and a few steps, seeded; runs in CI (on small
  generated files in the corpus' own format where the corpus is not on the CI machine) and checks the
  claims its page makes at that scale;
* ``cpu``: the corpus (whole, or as much as fits) on a 2-core machine in under 30 minutes;
* ``gpu``: the larger configuration for a machine with a GPU.

Each experiment (a module here: its scales, its runs, its claims and its page) writes one results page
(README.md, PNGs, results.json) with the command, the machine and the wall time.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from uedp.errors import UedpError
from uedp.experiments import (
    sanitize_conll,
    sanitize_sst2,
    selective_conll,
    selective_customersim,
    selective_wikitext,
    uedp_agnews,
    uedp_conll,
)
from uedp.experiments.common import SCALES, Context, Results, RunRow, Scale
from uedp.experiments.corpora import CORPORA
from uedp.experiments.page import Page, machine
from uedp.experiments.starts import SCRATCH, start_choice
from uedp.storage.home import DataHome


@dataclass(frozen=True)
class Experiment:
    name: str
    summary: str
    run: Callable[[Context], Page]  # train and measure, then build the page
    render: Callable[[Context, Results], Page]  # the page from figures already measured
    corpus: str = "conll"  # corpora.CORPORA: the folder option it reads its corpus from
    takes_start: bool = False  # runs its mechanisms from a pretrained start too (starts.py)


EXPERIMENTS = {
    "uedp-conll": Experiment("uedp-conll", "UeDP paper Fig. 2 and Fig. 4: noiseless, deid, userdp, uedp, uedp-naive, "
                             "uedp-bounded over epsilon; epsilon against rounds", uedp_conll.run,
                             uedp_conll.render, takes_start=True),
    "selective-conll": Experiment("selective-conll", "Selective-DP Tables 2 and 3: noiseless, dpsgd, selective "
                                  "(LSTM and GPT-2 two-phase) at equal epsilon, canary exposure",
                                  selective_conll.run, selective_conll.render, takes_start=True),
    "sanitize-conll": Experiment("sanitize-conll", "CusText / SanText: kept tokens, mask-inference attack, "
                                 "perplexity over epsilon", sanitize_conll.run, sanitize_conll.render),
    "selective-wikitext": Experiment("selective-wikitext", "Selective-DP Table 2 (left): word-level LSTM on "
                                     "WikiText-2 with the digit policy, noiseless, dpsgd and selective at epsilon "
                                     "~4.9, canary exposure", selective_wikitext.run, selective_wikitext.render,
                                     "wikitext", takes_start=True),
    "selective-customersim": Experiment("selective-customersim", "Selective-DP Table 2 (right) and Fig. 4: "
                                        "CustomerSim dialogs with the regex policy, LSTM and GPT-2, noiseless, "
                                        "dpsgd and selective, canary exposure", selective_customersim.run,
                                        selective_customersim.render, "simdial"),
    "sanitize-sst2": Experiment("sanitize-sst2", "the thesis' Table 3.1: SST-2 accuracy of a classifier trained "
                                "on CusText / SanText sanitized text over epsilon", sanitize_sst2.run,
                                sanitize_sst2.render, "sst2"),
    "uedp-agnews": Experiment("uedp-agnews", "UeDP paper Fig. 3, Fig. 2b and Fig. 6 on AG News: BERT / LSTM text "
                              "classification error and GPT-2 / LSTM next-word perplexity under noiseless, deid, "
                              "userdp and uedp over epsilon, entities from uedp's own NER", uedp_agnews.run,
                              uedp_agnews.render, "ag"),
}


def default_out(name: str, scale: Scale) -> Path:
    """Where a page goes: ``docs/results/<name>`` for the cpu scale, ``...-gpu`` / ``...-ci`` otherwise."""
    return Path("docs/results") / (name if scale == "cpu" else f"{name}-{scale}")


def reproduce(name: str, scale: Scale, home: DataHome, data_dir: Path, out: Path, device: str = "auto",
              threads: int = 1, say: Callable[[str], None] = print, command: list[str] | None = None,
              conll_dir: Path | None = None, start: str = SCRATCH, public_dir: Path | None = None,
              precision: str = "auto") -> Page:
    """Run one experiment at one scale and write its page into ``out`` (whole, or not at all).
    ``data_dir`` is the folder of the experiment's corpus (``Experiment.corpus``); ``conll_dir``
    CoNLL-2003's, for an experiment that learns from it besides (its own corpus' folder otherwise).
    ``start`` (scratch, base, a checkpoint folder, or auto: ``starts.start_choice``) adds rows from a
    pretrained start beside the from-scratch ones; ``public_dir`` is the base's public corpus; ``precision``
    every run's ``--precision``."""
    if name not in EXPERIMENTS:
        raise UedpError(f"unknown experiment {name!r}; valid: {', '.join(EXPERIMENTS)}")
    if scale not in SCALES:
        raise UedpError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    experiment = EXPERIMENTS[name]
    start = start_choice(start, scale, experiment.takes_start)
    conll = data_dir if experiment.corpus == "conll" else conll_dir
    ctx = Context(name, scale, home, data_dir, device, threads, say, conll, start, public_dir, precision)
    started = time.monotonic()
    page = experiment.run(ctx)
    minutes = (time.monotonic() - started) / 60
    shown = command or ["uedp", "reproduce", name, "--scale", scale, CORPORA[experiment.corpus].option, str(data_dir),
                        *(["--conll-dir", str(conll_dir)] if conll_dir and experiment.corpus != "conll" else []),
                        *(["--start", start] if start != SCRATCH else []),
                        *(["--precision", precision] if precision != "auto" else [])]
    made_by = (f"Made by `{shlex.join(shown)}` ({scale} scale) in **{minutes:.1f} minutes**"
               f"{reused_runs_said(minutes, page.results.runs)} on {machine()}, "
               f"{threads} torch thread(s), device {device}"
               f"{'' if precision == 'auto' else f', training forward passes in {precision}'}, on "
               f"{datetime.now(UTC):%Y-%m-%d}. "
               "Every run is in MLflow under the data home (`uedp serve`). The claims below are checked by the "
               "command itself on these figures; the test suite (`tests/test_reproduce*.py`) runs the ci scale and "
               "requires its claims to hold.")
    page.sections.insert(1, made_by)
    page.results.figures.update(wall_minutes=round(minutes, 2), scale=scale, made_by=made_by)
    page.corpus = experiment.corpus
    page.write(out)
    return page


def reused_runs_said(minutes: float, runs: list[RunRow]) -> str:
    """What a resumed page's wall time leaves out: a command run again trains only what is missing, so its own
    minutes can be a fraction of the training behind the page (a page from a 135M start: hours over several
    invocations). Said where the runs' own wall times add up to more than the command took."""
    run_minutes = sum(run.seconds for run in runs) / 60
    if run_minutes <= 1.1 * minutes:
        return ""
    return (f" (this invocation; it reused runs finished by earlier ones, and the runs' own wall times, MLflow's "
            f"start to end, add up to {run_minutes:.0f} minutes)")


RERENDERED = " This page was re-rendered from `results.json` on "


def rerender(name: str, home: DataHome, out: Path) -> Page:
    """Rebuild a page from its own ``results.json`` without training again (after the page's text or
    claims changed): the figures, the command, the machine and the wall time stay those of the run."""
    if name not in EXPERIMENTS:
        raise UedpError(f"unknown experiment {name!r}; valid: {', '.join(EXPERIMENTS)}")
    path = out / "results.json"
    if not path.is_file():
        raise UedpError(f"{path} not found: --page-only rebuilds a page that `uedp reproduce {name}` wrote there")
    data = json.loads(path.read_text(encoding="utf-8"))
    try:
        results = Results([RunRow(**row) for row in data["runs"]], dict(data["figures"]))
        scale = results.figures["scale"]
        ctx = Context(name, scale, home, Path("."))
        page = EXPERIMENTS[name].render(ctx, results)
    except (KeyError, TypeError) as exc:
        raise UedpError(f"{path}: not a results file of this uedp ({exc})") from None
    readme = out / "README.md"
    made_by = results.figures.get("made_by") or next(
        (line for line in (readme.read_text(encoding="utf-8").splitlines() if readme.is_file() else [])
         if line.startswith("Made by ")), "")
    made_by = made_by.split(RERENDERED)[0].rstrip()  # a page re-rendered before says so once, not once per time
    page.results.figures["made_by"] = made_by
    page.sections.insert(1, f"{made_by}{RERENDERED}{datetime.now(UTC):%Y-%m-%d} (`--page-only`).")
    page.corpus = EXPERIMENTS[name].corpus
    page.write(out)
    return page


def command_line() -> list[str]:
    """This process' command line as the user typed it (the page records it)."""
    return ["uedp", *sys.argv[1:]]
