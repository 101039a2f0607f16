"""Wall time of the command line's first answers: ``uedp --version`` and ``uedp --help`` (aim: under 1 s;
the entry point answers them without importing torch, Prefect or the configuration models) beside
``uedp train --help`` (which builds every command's options from the typed models).

    python benchmarks/cli_startup.py [--repeats 5]

Each is run as a fresh process (the console script of this environment); the median is printed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def wall(command: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    uedp = shutil.which("uedp", path=str(Path(sys.executable).parent)) or "uedp"
    python = wall([sys.executable, "-c", "pass"], args.repeats)
    print(f"python -c pass      {python:6.3f} s  (the interpreter alone)")
    for argv in (["--version"], ["--help"], ["train", "--help"]):
        print(f"uedp {' '.join(argv):<14} {wall([uedp, *argv], args.repeats):6.3f} s")


if __name__ == "__main__":
    main()
