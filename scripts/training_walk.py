"""The walk of a training configuration from the CLI to the round loop, measured on a real run.

An architecture review follows one configuration through the code: which functions it stops at, in how
many files, and how often the walk climbs back up the layers (a service that calls back into a higher
layer's work, or a low-level step followed by a high-level one in the same walk: the place where the way
data flows goes back and forth). This script measures that walk instead of reading it by hand: it traces
``uedp train`` in-process on the packaged demo corpus, from the command to the first call of a
mechanism's ``train`` (the round loop's entry), and prints

* stops: the project functions the walk enters, each counted once, in the order first entered;
* files: the files those stops are in;
* steps back up: consecutive stops where the next is in a higher layer than the one before it;
* inside set-up: the stops entered while training set-up runs, and how many of them draw or charge a
  local-DP release (set-up should open its inputs, never make them).

    python scripts/training_walk.py                     # a user-level run and a local-DP (custext) run
    python scripts/training_walk.py --mechanism custext --list

Layers, top to bottom, as ``tests/test_architecture.py`` states them: cli, commands, the stack and the
results pages, flows, tasks, services, the privacy core/storage/detection, models, leaves.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import os
import pkgutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

LAYERS = (("uedp/cli.py", 8), ("uedp/commands", 7), ("uedp/", 6), ("experiments/", 6), ("flows/", 5),
          ("tasks/", 4), ("services/", 3), ("privacy/", 2), ("storage/", 2), ("detection/", 2),
          ("deployments/", 2), ("models/", 1))
MAPPED = ("flows", "tasks", "services", "privacy", "storage", "detection", "deployments", "models", "experiments")
LEAVES = ("uedp/errors.py", "uedp/progress.py", "uedp/__init__.py")


@dataclass(frozen=True)
class Stop:
    file: str
    function: str
    layer: int
    in_setup: bool = False  # entered while training set-up (services/training_setup.py: set_up) runs


# Where drawing a local-DP release (and filing it in the ledger) lives: set-up should open, never draw.
DRAWING = ("services/sanitize.py", "services/sanitize_attack.py", "services/privacy_budget.py",
           "privacy/sanitization/")


def _inside_setup(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "set_up" and frame.f_code.co_filename.endswith("training_setup.py"):
            return True
        frame = frame.f_back
    return False


def layer_of(relative: str) -> int | None:
    if relative in LEAVES:
        return 0
    for prefix, layer in LAYERS:
        if relative.startswith(prefix):
            return layer
    return None


class Walk:
    """Project functions entered from the command to the first ``Mechanism.train``, each once."""

    def __init__(self, root: Path) -> None:
        self.root = str(root.absolute()) + os.sep
        self.stops: list[Stop] = []
        self.seen: set[tuple[str, str]] = set()
        self.done = False

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.done or event != "call" or not frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            return  # module and class bodies are not stops
        filename = frame.f_code.co_filename
        if not filename.startswith(self.root):
            return
        relative = filename[len(self.root):]
        head, _, rest = relative.partition("/")
        if head == "uedp" and rest.split("/")[0] in MAPPED:  # an installed layout: uedp/services/... is services/...
            relative = rest
        layer = layer_of(relative)
        if layer is None:
            return
        name = frame.f_code.co_qualname
        if name.rsplit(".", 1)[-1].startswith("<") or (relative, name) in self.seen:  # comprehensions, lambdas,
            return  # and generator expressions are no stops; a function is a stop once
        self.seen.add((relative, name))
        self.stops.append(Stop(relative, name, layer, _inside_setup(frame.f_back)))
        if relative.startswith("privacy/mechanisms/") and name.endswith(".train"):
            self.done = True  # the round loop's entry: the walk ends here

    def steps_back_up(self) -> int:
        return sum(1 for before, after in zip(self.stops, self.stops[1:]) if after.layer > before.layer)


def _prepare(home: Path) -> None:
    from typer.testing import CliRunner

    from uedp.commands import app

    corpus = Path(__import__("uedp.data", fromlist=["x"]).__file__).parent / "demo.conll"
    runner = CliRunner()
    for args in (["ingest", "conll2003", str(corpus), "--name", "demo"], ["detect", "demo", "--detector", "gold"]):
        result = runner.invoke(app, [*args, "--home", str(home)])
        if result.exit_code != 0:
            raise SystemExit(f"uedp {' '.join(args)} failed:\n{result.output}")
    # custext's word vectors: random ones for every word of the corpus (the walk, not the release, matters)
    import random
    import re

    words = sorted(set(re.findall(r"\w+|[^\w\s]", corpus.read_text(encoding="utf-8"))) - {"DOCSTART"})
    rng = random.Random(0)
    (home / "vectors.txt").write_text("".join(f"{w} " + " ".join(f"{rng.gauss(0, 1):.4f}" for _ in range(8)) + "\n"
                                              for w in words), encoding="utf-8")


def import_everything() -> None:
    """Every module of the package, imported before the walk: what runs at import (registries, models'
    class bodies) is not a step of any training."""
    import uedp

    for module in pkgutil.walk_packages(uedp.__path__, "uedp."):
        with contextlib.suppress(ImportError):  # an optional extra this machine lacks: no stop of this walk
            importlib.import_module(module.name)


def walk(mechanism: str, home: Path, root: Path) -> Walk:
    from typer.testing import CliRunner

    from uedp.commands import app

    settings = (["--steps", "1", "--target-epsilon", "1", "--k", "5", "--categories", "PII", "--embeddings",
                 str(home / "vectors.txt")] if mechanism == "custext" else ["--rounds", "1"])
    args = ["train", "demo", "--mechanism", mechanism, "--seeded", "--home", str(home), *settings]
    tracer = Walk(root)
    sys.setprofile(tracer.profile)
    try:
        result = CliRunner().invoke(app, args)
    finally:
        sys.setprofile(None)
    if not tracer.done:
        raise SystemExit(f"uedp {' '.join(args)} did not reach a mechanism's train ({result.exit_code}):\n"
                         f"{result.output}")
    return tracer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mechanism", action="append", help="mechanisms to walk (default: userdp and custext)")
    parser.add_argument("--list", action="store_true", help="print every stop")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout whose files count as the project's (default: this one)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("MLFLOW_TRACKING_URI", "")
    import_everything()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        _prepare(home)
        for mechanism in args.mechanism or ["userdp", "custext"]:
            tracer = walk(mechanism, home, args.root)
            files = dict.fromkeys(stop.file for stop in tracer.stops)
            setup = [stop for stop in tracer.stops if stop.in_setup]
            drawing = [stop for stop in setup if stop.file.startswith(DRAWING)]
            print(f"{mechanism}: {len(tracer.stops)} stops in {len(files)} files, "
                  f"{tracer.steps_back_up()} steps back up; inside set-up {len(setup)} stops in "
                  f"{len(set(stop.file for stop in setup))} files, {len(drawing)} of them drawing or charging a "
                  f"release")
            if args.list:
                for number, stop in enumerate(tracer.stops, 1):
                    print(f"  {number:3d} [{stop.layer}]{' setup' if stop.in_setup else ''} {stop.file}: {stop.function}")


if __name__ == "__main__":
    main()
