"""What every results page's command writes beside its figures: ``command.txt``, the command that made it,
the machine and the wall time (imported by the scripts in this folder, which run as ``python experiments/X.py``)."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def write_command_file(out: Path, minutes: float, threads: str, *extra: str, name: str = "command.txt") -> None:
    """``out/command.txt`` (or ``name``): this script's command line, ``extra`` lines (e.g. the sweep it ran),
    the machine (``threads``: how many torch threads the runs used, in words) and the total wall time."""
    lines = ["python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), *extra,
             f"machine: {platform.machine()}, {os.cpu_count()} CPUs ({threads}), {platform.system()} "
             f"{platform.release()}, Python {platform.python_version()}",
             f"total wall time: {minutes:.1f} min"]
    (out / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out} in {minutes:.1f} min")
