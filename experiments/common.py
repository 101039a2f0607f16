"""What every reproduction page is made of: its context (inputs, scale, data home, where it says
things), the runs it trained as rows, and its results. The rest of a page's shared machinery lives by
concern beside this: ``corpora`` (the public inputs and their ingest), ``runs`` (sweeps and MLflow
reads), ``claims`` (what a page checks), ``page`` (the written page and its prose), ``epsilon_curves``
(the UeDP paper's Fig. 4).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from uedp.errors import UedpError
from uedp.storage.home import DataHome

Scale = Literal["ci", "cpu", "gpu"]
SCALES: tuple[Scale, ...] = ("ci", "cpu", "gpu")


@dataclass
class Context:
    """One reproduction's inputs and where its work goes. ``data_dir`` is the folder of the experiment's
    corpus (``Experiment.corpus``): CoNLL-2003's, WikiText-2's, CustomerSim's ... ``conll_dir`` is
    CoNLL-2003's folder where an experiment reads it: its own corpus, or public text it learns from
    besides (uedp-agnews trains its NER on CoNLL's gold tags); None where it was not given."""

    name: str
    scale: Scale
    home: DataHome
    data_dir: Path
    device: str = "auto"
    threads: int = 1
    say: Callable[[str], None] = print
    conll_dir: Path | None = None
    start: str = "scratch"  # starts.py: scratch, base or a checkpoint folder (pages that take a start)
    public_dir: Path | None = None  # the public base's corpus (Reuters-21578); None: $UEDP_REUTERS_DIR or ../shared
    precision: str = "auto"  # every run's --precision (bf16: the CPU's bf16 autocast in training)


@dataclass(frozen=True)
class RunRow:
    """One trained model's figures as a page shows them."""

    label: str  # the mechanism as reports show it (uedp-bounded-k1)
    family: str  # the model (gpt2 tiny, lstm tiny)
    target: float | None  # the target epsilon it was calibrated to; None: no budget
    epsilon: float  # accounted (inf: no guarantee)
    perplexity: float  # test
    seconds: float  # wall time of the run (MLflow's start and end)
    run_id: str
    extra: dict[str, float] = field(default_factory=dict)  # exposure, kept-token share, data used ...
    # What the pages' shared ``rows`` carry besides (:func:`shared_rows`); empty on pages made before them
    mechanism: str = ""
    variant: str = ""  # what tells the run apart beyond its mechanism: uedp-bounded's k, grid values, lora8
    seed: int | None = None
    start: str = "scratch"  # starts.py: scratch, base, a packaged base (smollm2) or a checkpoint folder's name


@dataclass
class Results:
    """Everything a page reports: the runs, and any other figures (curves, shares) by name."""

    runs: list[RunRow] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def select(self, label: str, target: float | None = None, family: str | None = None) -> list[RunRow]:
        return [r for r in self.runs if r.label == label and (target is None or r.target == target)
                and (family is None or r.family == family)]

    def perplexity(self, label: str, target: float | None = None, family: str | None = None) -> float:
        """Mean test perplexity over seeds (a missing configuration is an error naming it)."""
        rows = self.select(label, target, family)
        if not rows:
            raise UedpError(f"no finished run of {label}" + (f" at epsilon {target:g}" if target else "")
                            + (f" ({family})" if family else ""))
        return statistics.fmean(r.perplexity for r in rows)

    def extra(self, label: str, key: str, target: float | None = None, family: str | None = None) -> float:
        rows = [r for r in self.select(label, target, family) if key in r.extra]
        if not rows:
            raise UedpError(f"no {key} for {label}" + (f" at epsilon {target:g}" if target else ""))
        return statistics.fmean(r.extra[key] for r in rows)

    def targets(self) -> list[float]:
        return sorted({r.target for r in self.runs if r.target is not None})
