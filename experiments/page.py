"""A results page as written: its sections, figures, results.json (written whole or not at all), the
numbers and sentences pages share, and the command line and ``command.txt`` of the page scripts."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from uedp.experiments.claims import Verdict
from uedp.experiments.common import Results
from uedp.experiments.runs import shared_rows

UNIFORM_BYTE_PERPLEXITY = 257.0  # byte tokens: a uniform guess over 256 bytes and the end mark


class OneBudget(Protocol):
    """A page's settings with one target epsilon, or (ci) one noise multiplier instead."""

    @property
    def epsilon(self) -> float: ...
    @property
    def noise_multiplier(self) -> float | None: ...


class TargetBudgets(Protocol):
    """A page's settings with target epsilons, or (ci: none) one noise multiplier instead."""

    @property
    def epsilons(self) -> tuple[float, ...]: ...
    @property
    def noise_multiplier(self) -> float | None: ...


def budget_at(s: OneBudget) -> str:
    """The budget of a one-epsilon page's private runs, as a claim or figure says "at ...": its epsilon, or
    the noise multiplier that stands in for it."""
    return f"noise multiplier {s.noise_multiplier:g}" if s.noise_multiplier else f"epsilon {s.epsilon:g}"


def one_budget_sentence(s: OneBudget) -> str:
    """The budget of a one-epsilon page's private runs, as its settings paragraph opens."""
    if s.noise_multiplier:
        return f"Noise multiplier {s.noise_multiplier:g} (no calibration at this scale), epsilon accounted"
    return f"Target epsilon {s.epsilon:g}"


def budgets_sentence(s: TargetBudgets) -> str:
    """The budget of a page's private runs over several target epsilons, as its settings paragraph says it
    (ci: one noise multiplier, since calibrating each target outlasts the whole ci training)."""
    if s.epsilons:
        return f"Target epsilons {', '.join(f'{e:g}' for e in s.epsilons)}"
    return f"Noise multiplier {s.noise_multiplier:g} for every private mechanism (no calibration), epsilon accounted"


def machine() -> str:
    import torch

    cpus = os.cpu_count() or 0
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.machine()}, {cpus} CPUs, {gpu}, {platform.system()} {platform.release()}, " \
           f"Python {platform.python_version()}, torch {torch.__version__}"


def number(value: float, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "inf"
    if abs(value) >= 1e4:
        return f"{value:.2e}"
    return f"{value:.{digits}g}"


def perplexity_text(value: float, uniform: float = UNIFORM_BYTE_PERPLEXITY) -> str:
    """Perplexity as a page shows it, saying when a model is worse than a uniform guess over its tokens
    (bytes unless ``uniform`` says otherwise: a BPE vocabulary's size)."""
    if value >= max(1e4, 10 * uniform):
        return f"{value:.1e} (diverged)"
    return number(value, 4) + (" (worse than uniform)" if value > uniform else "")


def markdown_table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "|".join("---" if i == 0 else "---:" for i in range(len(header)))
    lines = ["| " + " | ".join(header) + " |", "|" + align + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def verdict_table(verdicts: list[Verdict]) -> str:
    rows = [[v.statement, v.seeds, v.ours, f"**{v.verdict}**"] for v in verdicts]
    return markdown_table(["claim", "the seed paper", "ours", "verdict"], rows, "---|---|---|---")


@dataclass
class Page:
    """A results page: Markdown sections and figures, written into a folder as one unit."""

    title: str
    sections: list[str]
    figures: dict[str, Any]  # file name -> matplotlib figure
    results: Results
    verdicts: list[Verdict]
    corpus: str = ""  # the experiment's corpus (corpora.CORPORA), named in the shared rows

    def write(self, folder: Path) -> list[Path]:
        """Write README.md, results.json and the PNGs into a fresh temporary folder, then swap it in: a
        failure leaves the old page whole."""
        import matplotlib.pyplot as plt

        folder = folder.resolve()
        folder.parent.mkdir(parents=True, exist_ok=True)
        partial = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        try:
            for name, figure in self.figures.items():
                figure.savefig(partial / name)
                plt.close(figure)
            (partial / "README.md").write_text(f"# {self.title}\n\n" + "\n\n".join(self.sections).rstrip() + "\n",
                                               encoding="utf-8")
            data = {"runs": [asdict(r) for r in self.results.runs], "figures": self.results.figures,
                    "claims": [asdict(v) for v in self.verdicts],
                    "rows": shared_rows(self.results.runs, self.corpus)}
            (partial / "results.json").write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
            old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
            if folder.exists():
                folder.rename(old)
            partial.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return sorted(folder.iterdir())


def conll_page_parser(doc: str | None, out: str, home_help: str) -> argparse.ArgumentParser:
    """The command line a CoNLL-2003 page script starts from: ``--conll-dir`` (required), ``--out`` (default:
    ``out``, the page's folder) and ``--home``; the page adds its own options after these."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conll-dir", type=Path, required=True, help="folder with eng.train, eng.testa, eng.testb")
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--home", type=Path, help=home_help)
    return parser


def write_command_file(out: Path, minutes: float, threads: str, *extra: str, name: str = "command.txt") -> None:
    """``out/command.txt`` (or ``name``): this script's command line, ``extra`` lines (e.g. the sweep it ran),
    the machine (``threads``: how many torch threads the runs used, in words) and the total wall time."""
    lines = ["python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), *extra,
             f"machine: {platform.machine()}, {os.cpu_count()} CPUs ({threads}), {platform.system()} "
             f"{platform.release()}, Python {platform.python_version()}",
             f"total wall time: {minutes:.1f} min"]
    (out / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out} in {minutes:.1f} min")
