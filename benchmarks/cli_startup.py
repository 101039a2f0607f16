"""CPU time of the command line's first answers, each a fresh process: ``uedp --version`` and ``--help``
(answered from a table), a command that reads the data home (``uedp datasets``), and bad input that each
command must refuse before it imports torch, Prefect, MLflow or dp_accounting (aim: under 1 s of CPU).

    python benchmarks/cli_startup.py [--repeats 3] [--compare OTHER_UEDP]

``--compare`` runs another installation's console script (an older checkout's ``.venv/bin/uedp``) on the same
invocations, interleaved with this one's, and prints the ratio: the machine is shared, so only a ratio
measured in one run says what changed. The median of user + system CPU over the repeats is printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# (label, arguments): each refused (exit 2) or answered without training; ``{home}`` is an empty data home,
# ``{empty}`` an empty file.
INVOCATIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("--version", ("--version",)),
    ("--help", ("--help",)),
    ("datasets", ("datasets", "--home", "{home}")),
    ("budget: unknown dataset", ("budget", "nope", "--home", "{home}")),
    ("epsilon: target 0", ("epsilon", "--mechanism", "userdp", "--users", "946", "--target-epsilon", "0")),
    ("train: unknown dataset, target 0", ("train", "nope", "--mechanism", "userdp", "--target-epsilon", "0",
                                          "--home", "{home}")),
    ("train: unknown dataset", ("train", "nope", "--mechanism", "userdp", "--home", "{home}")),
    ("sweep: unknown dataset", ("sweep", "nope", "--home", "{home}")),
    ("generate: not a run id", ("generate", "nope", "--home", "{home}")),
    ("evaluate: unknown dataset", ("evaluate", "nope", "--home", "{home}")),
    ("attack: not a run id", ("attack", "nope", "--home", "{home}")),
    ("detect: unknown dataset", ("detect", "nope", "--home", "{home}")),
    ("entities: unknown dataset", ("entities", "nope", "--home", "{home}")),
    ("sanitize: unknown dataset", ("sanitize", "nope", "--mechanism", "custext", "--epsilon", "1", "--embeddings", "x.vec",
                                   "--home", "{home}")),
    ("report: --parent not a run id", ("report", "nope", "--parent", "nope", "--home", "{home}")),
    ("ingest: missing file", ("ingest", "conll2003", "/nonexistent/train.txt", "--name", "x", "--home", "{home}")),
    ("ingest: empty file", ("ingest", "conll2003", "{empty}", "--name", "x", "--home", "{home}")),
    ("train --help", ("train", "--help")),
)


def cpu_seconds(command: list[str]) -> float:
    """User + system CPU of one child process, from ``os.wait4`` (not the wall clock a loaded machine inflates)."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare", help="another installation's uedp console script, run on the same invocations")
    args = parser.parse_args()
    uedp = shutil.which("uedp", path=str(Path(sys.executable).parent)) or "uedp"
    scripts = [uedp] + ([args.compare] if args.compare else [])
    os.environ.setdefault("UEDP_HOME", tempfile.mkdtemp(prefix="uedp-startup-"))  # `uedp epsilon` creates no home
    with tempfile.TemporaryDirectory(prefix="uedp-startup-") as folder:
        home = str(Path(folder) / "home")
        (Path(folder) / "empty.txt").touch()
        python = statistics.median(cpu_seconds([sys.executable, "-c", "pass"]) for _ in range(args.repeats))
        print(f"{'python -c pass':36s} {python:6.2f} s CPU  (the interpreter alone)")
        header = f"{'uedp ...':36s} {'this':>8s}" + (f" {'other':>8s} {'other/this':>10s}" if args.compare else "")
        print(header)
        for label, argv in INVOCATIONS:
            command = [a.replace("{home}", home).replace("{empty}", str(Path(folder) / "empty.txt")) for a in argv]
            samples: dict[str, list[float]] = {script: [] for script in scripts}
            for _ in range(args.repeats):
                for script in scripts:  # interleaved: both see the same load
                    samples[script].append(cpu_seconds([script, *command]))
            mine = statistics.median(samples[uedp])
            line = f"{label:36s} {mine:6.2f} s"
            if args.compare:
                other = statistics.median(samples[args.compare])
                line += f" {other:6.2f} s {other / mine:9.1f}x"
            print(line, flush=True)


if __name__ == "__main__":
    main()
