"""The entry point answers ``uedp --help`` and ``uedp --version`` from a table, without importing torch,
Prefect, MLflow or the configuration models; the table is the commands' own first sentences; every
other invocation reaches the commands unchanged."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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


# What a command that needs no training machinery must not import before it answers or refuses its input.
MACHINERY = ("torch", "dp_accounting", "prefect", "mlflow", "transformers", "spacy", "presidio_analyzer")


def _imports_of(*args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    code = ("import sys; sys.argv = ['uedp', *sys.argv[1:]]; import uedp.cli\n"
            "try:\n    uedp.cli.main()\nexcept SystemExit as exit:\n    code = exit.code\n"
            f"print('imported:', sorted(m for m in {MACHINERY!r} if m in sys.modules)); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    return done, ast.literal_eval(done.stdout.splitlines()[-1].removeprefix("imported: "))


def test_the_command_group_table_names_where_each_command_is_defined() -> None:
    """``uedp COMMAND`` imports only the group :data:`uedp.commands.COMMAND_GROUPS` names: it must define it."""
    from uedp.commands import COMMAND_GROUPS, GROUPS

    group = typer.main.get_command(app)
    context = click.Context(group)
    assert set(COMMAND_GROUPS) == set(group.list_commands(context)) == set(entry.COMMANDS)
    for name in COMMAND_GROUPS:
        command = group.get_command(context, name)
        callback = command.callback if command.callback is not None else None
        module = callback.__module__ if callback is not None else next(
            c.callback.__module__ for c in command.commands.values())  # a sub-app (ner): its commands' module
        assert module == f"uedp.commands.{COMMAND_GROUPS[name]}", name
    assert set(COMMAND_GROUPS.values()) == set(GROUPS)


def test_commands_refuse_bad_input_before_importing_the_training_machinery(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    empty = tmp_path / "empty.txt"
    empty.touch()
    refused = {
        ("budget", "nope", "--home", home): "no dataset 'nope'",
        ("train", "nope", "--mechanism", "userdp", "--target-epsilon", "0", "--home", home): "target_epsilon",
        ("train", "nope", "--mechanism", "userdp", "--home", home): "dataset 'nope' has no sentences table",
        ("sweep", "nope", "--home", home): "dataset 'nope' has no sentences table",
        ("tune", "nope", "--mechanism", "userdp", "--home", home): "dataset 'nope' has no sentences table",
        ("detect", "nope", "--home", home): "dataset 'nope' has no sentences table",
        ("sanitize", "nope", "--mechanism", "custext", "--epsilon", "1", "--embeddings", "x.vec", "--home", home):
            "no sentences table",
        ("generate", "nope", "--home", home): "not an MLflow run id",
        ("attack", "nope", "--home", home): "not an MLflow run id",
        ("report", "demo", "--parent", "nope", "--home", home): "not an MLflow run id",
        ("epsilon", "--mechanism", "userdp", "--users", "946", "--target-epsilon", "0"): "target_epsilon",
        ("ingest", "conll2003", str(empty), "--name", "e", "--home", home): "empty file (0 bytes)",
        ("ingest", "conll2003", str(tmp_path / "absent.txt"), "--name", "e", "--home", home): "file not found",
        ("ingest", "conll2003", str(empty), "--name", "e", "--set", "split=bogus", "--home", home): "invalid split",
    }
    for args, said in refused.items():
        done, imported = _imports_of(*args)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
        assert imported == [], f"uedp {' '.join(args)} imported {imported} before refusing"
    listed, imported = _imports_of("datasets", "--home", home)
    assert listed.returncode == 0 and "no datasets under" in listed.stdout and imported == []


def test_one_group_then_all_lists_the_commands_in_the_usual_order() -> None:
    """A process that ran one group's command and then asks for every command (a test, the CLI reference)
    lists them as a process that asked for every command at once."""
    def listed(first: str) -> list[str]:
        code = (f"import typer.main, click\nfrom uedp import commands\n{first}\napp = commands.load()\n"
                "group = typer.main.get_command(app)\nprint(','.join(group.list_commands(click.Context(group))))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        return done.stdout.strip().split(",")

    usual = listed("pass")
    assert usual[:3] == ["demo", "ingest", "detect"] and set(usual) == set(entry.COMMANDS)
    assert listed("commands.load('datasets')") == usual
