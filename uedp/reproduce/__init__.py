"""``uedp reproduce``: the seed papers' experiments, one command each, at three scales.

* ``ci``: the first documents of each CoNLL-2003 file and a few steps, seeded; runs in CI and checks
  the claims its page makes at that scale;
* ``cpu``: the whole corpus on a 2-core machine in under 30 minutes;
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
from uedp.reproduce import sanitize_conll, selective_conll, uedp_conll
from uedp.reproduce.common import SCALES, Context, Page, Results, RunRow, Scale, machine
from uedp.storage.home import DataHome


@dataclass(frozen=True)
class Experiment:
    name: str
    summary: str
    run: Callable[[Context], Page]  # train and measure, then build the page
    render: Callable[[Context, Results], Page]  # the page from figures already measured


EXPERIMENTS = {
    "uedp-conll": Experiment("uedp-conll", "UeDP paper Fig. 2 and Fig. 4: noiseless, deid, userdp, uedp, uedp-naive, "
                             "uedp-bounded over epsilon; epsilon against rounds", uedp_conll.run,
                             uedp_conll.render),
    "selective-conll": Experiment("selective-conll", "Selective-DP Tables 2 and 3: noiseless, dpsgd, selective "
                                  "(LSTM and GPT-2 two-phase) at equal epsilon, canary exposure",
                                  selective_conll.run, selective_conll.render),
    "sanitize-conll": Experiment("sanitize-conll", "CusText / SanText: kept tokens, mask-inference attack, "
                                 "perplexity over epsilon", sanitize_conll.run, sanitize_conll.render),
}


def default_out(name: str, scale: Scale) -> Path:
    """Where a page goes: ``docs/results/<name>`` for the cpu scale, ``...-gpu`` / ``...-ci`` otherwise."""
    return Path("docs/results") / (name if scale == "cpu" else f"{name}-{scale}")


def reproduce(name: str, scale: Scale, home: DataHome, conll_dir: Path, out: Path, device: str = "auto",
              threads: int = 1, say: Callable[[str], None] = print, command: list[str] | None = None) -> Page:
    """Run one experiment at one scale and write its page into ``out`` (whole, or not at all)."""
    if name not in EXPERIMENTS:
        raise UedpError(f"unknown experiment {name!r}; valid: {', '.join(EXPERIMENTS)}")
    if scale not in SCALES:
        raise UedpError(f"unknown scale {scale!r}; valid: {', '.join(SCALES)}")
    experiment = EXPERIMENTS[name]
    ctx = Context(name, scale, home, conll_dir, device, threads, say)
    started = time.monotonic()
    page = experiment.run(ctx)
    minutes = (time.monotonic() - started) / 60
    shown = command or ["uedp", "reproduce", name, "--scale", scale, "--conll-dir", str(conll_dir)]
    made_by = (f"Made by `{shlex.join(shown)}` ({scale} scale) in **{minutes:.1f} minutes** on {machine()}, "
               f"{threads} torch thread(s), device {device}, on {datetime.now(UTC):%Y-%m-%d}. "
               "Every run is in MLflow under the data home (`uedp serve`). The claims below are checked by the "
               "command itself on these figures; `tests/test_reproduce.py` runs the ci scale and requires its "
               "claims to hold.")
    page.sections.insert(1, made_by)
    page.results.figures.update(wall_minutes=round(minutes, 2), scale=scale, made_by=made_by)
    page.write(out)
    return page


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
    page.write(out)
    return page


def command_line() -> list[str]:
    """This process' command line as the user typed it (the page records it)."""
    return ["uedp", *sys.argv[1:]]
