"""The ``uedp`` commands (the entry point, :mod:`uedp.cli`, imports this package only when a command runs).
Every command has ``--help``; bad input prints one line and exits 2.

Prefect and the flows are imported inside commands, after the data home and Prefect's settings are
known, because Prefect reads its settings at import time.

The commands live in one module per group (:mod:`.data`, :mod:`.training`, :mod:`.synthetic`, :mod:`.results`,
:mod:`.home`, :mod:`.serve`, :mod:`.demo`), each registering on the one app of :mod:`.common`. ``uedp COMMAND``
imports the group that defines COMMAND and no other (:func:`main`): ``uedp datasets`` or ``uedp budget`` never
import the configuration models, torch or dp_accounting that the training commands' flags are derived from.
``app`` (for tests and the CLI reference) is every group, in the order ``uedp --help`` lists them.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer

# The command groups, in the order ``uedp --help`` and docs/cli.md list their commands.
GROUPS = ("demo", "data", "training", "synthetic", "results", "serve", "home")

# The group whose module defines each command (tests/test_cli_entry.py keeps it equal to what each registers).
COMMAND_GROUPS: dict[str, str] = {
    "demo": "demo",
    "ingest": "data", "detect": "data", "sanitize": "data", "ner": "data", "entities": "data",
    "epsilon": "training", "train": "training", "tune": "training", "sweep": "training",
    "generate": "synthetic",
    "report": "results", "pretrain": "results", "base": "results", "evaluate": "results", "reproduce": "results",
    "attack": "results",
    "serve": "serve",
    "sql": "home", "budget": "home", "datasets": "home",
}

__all__ = ["COMMAND_GROUPS", "GROUPS", "app", "load", "main"]


def load(command: str | None = None) -> typer.Typer:
    """The app with the group that defines ``command`` registered, or every group (an unknown or no command:
    Click then lists or names them all). Groups registered later keep the listing order of :data:`GROUPS`."""
    from uedp.commands.common import app, flow_help_of

    groups = (COMMAND_GROUPS[command],) if command in COMMAND_GROUPS else GROUPS
    for group in groups:
        importlib.import_module(f"{__name__}.{group}")
    flow_help_of(app)
    if len(groups) > 1:  # one process that ran a single group first, then asked for all: list them in order
        app.registered_commands.sort(key=lambda info: GROUPS.index(_group_of(info.callback)))
    return app


def _group_of(callback: Any) -> str:
    return str(getattr(callback, "__module__", "")).rsplit(".", 1)[-1]


def main() -> None:
    """Run the command ``sys.argv`` names (called by :func:`uedp.cli.main`). The root takes no option with a
    value, so the first argument not starting with ``-`` is the command."""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    sys.exit(load(command)())


def __getattr__(name: str) -> Any:
    """``uedp.commands.app``: every command registered."""
    if name == "app":
        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
