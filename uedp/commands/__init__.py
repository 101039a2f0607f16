"""The ``uedp`` commands (the entry point, :mod:`uedp.cli`, imports this module only when a command runs).
Every command has ``--help``; bad input prints one line and exits 2.

Prefect and the flows are imported inside commands, after the data home and Prefect's settings are
known, because Prefect reads its settings at import time.

The commands live in one module per group (:mod:`.data`, :mod:`.training`, :mod:`.synthetic`, :mod:`.results`,
:mod:`.home`, :mod:`.serve`, :mod:`.demo`), each registering on the one app of :mod:`.common`; importing this package
registers them all, in the order ``uedp --help`` lists them.
"""

from __future__ import annotations

import importlib
import sys

from uedp.commands.common import app

# Each group registers its commands when imported; ``uedp --help`` and docs/cli.md list them in this order.
GROUPS = ("demo", "data", "training", "synthetic", "results", "serve", "home")
for _group in GROUPS:
    importlib.import_module(f"uedp.commands.{_group}")

__all__ = ["app", "main"]


def main() -> None:
    """Run the command ``sys.argv`` names (called by :func:`uedp.cli.main`)."""
    sys.exit(app())


if __name__ == "__main__":
    main()
