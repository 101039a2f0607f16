"""The entry point answers ``uedp --help`` and ``uedp --version`` from a table, without importing torch,
Prefect, MLflow or the configuration models; the table is the commands' own first sentences; every
other invocation reaches the commands unchanged."""

from __future__ import annotations

import subprocess
import sys

import click
import typer.main

import uedp.cli as entry
from uedp import __version__
from uedp.commands import app

HEAVY = ("torch", "prefect", "mlflow", "pydantic", "transformers", "dp_accounting", "typer", "uedp.commands")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    code = ("import sys; sys.argv = ['uedp', *sys.argv[1:]]; import uedp.cli\n"
            "try:\n    uedp.cli.main()\nexcept SystemExit as exit:\n    code = exit.code\n"
            f"print('imported:', sorted(m for m in {HEAVY!r} if m in sys.modules)); sys.exit(code)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_version_and_help_import_nothing_heavy() -> None:
    version = _run("--version")
    assert version.returncode == 0 and version.stdout.splitlines()[0] == f"uedp {__version__}"
    assert version.stdout.splitlines()[-1] == "imported: []"
    shown = _run("--help")
    assert shown.returncode == 0 and shown.stdout.splitlines()[-1] == "imported: []"
    for name in entry.COMMANDS:
        assert f"  {name} " in shown.stdout


def test_the_help_table_is_the_commands_own_first_sentences() -> None:
    group = typer.main.get_command(app)
    context = click.Context(group)
    own = {name: entry.first_sentence(group.get_command(context, name).help) for name in group.list_commands(context)}
    assert own == entry.COMMANDS, "update uedp/cli.py's COMMANDS to the commands' first sentences"


def test_anything_else_reaches_the_commands() -> None:
    train_help = _run("train", "--help")
    assert train_help.returncode == 0 and "--mechanism" in train_help.stdout
    assert "uedp.commands" in train_help.stdout.splitlines()[-1]
    unknown = _run("no-such-command")
    assert unknown.returncode == 2 and "No such command" in unknown.stderr
    assert entry.app is app  # uedp.cli.app, for tests and the CLI reference
