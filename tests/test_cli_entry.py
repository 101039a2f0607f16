"""The entry point answers ``uedp --help`` and ``uedp --version`` from a table, without importing torch,
Prefect, MLflow or the configuration models; the table is the commands' own first sentences; every
other invocation reaches the commands unchanged."""

from __future__ import annotations

import json
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


def _imports_of(*invocations: tuple[str, ...]) -> list[tuple[int, str, list[str]]]:
    """Run each invocation of ``uedp`` in turn in one fresh process (what one imports stays imported for the
    next, so a clean list after each says that none imported the machinery): exit code, stderr and the
    machinery imported so far, for each."""
    code = f"""
import contextlib, io, json, sys
import uedp.cli
out = []
for args in json.loads(sys.argv[1]):
    sys.argv, err = ["uedp", *args], io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            uedp.cli.main()
            code = 0
        except SystemExit as exit:
            code = exit.code
    out.append([code, err.getvalue(), sorted(m for m in {MACHINERY!r} if m in sys.modules)])
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code, json.dumps(invocations)], capture_output=True, text=True,
                          timeout=300, check=True)
    return [(code, err, imported) for code, err, imported in json.loads(done.stdout.splitlines()[-1])]


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
        ("detect", "nope", "--detector", "spacy", "--home", home): "need a spaCy pipeline",
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
    answers = _imports_of(*refused, ("datasets", "--home", home))
    for (args, said), (code, stderr, imported) in zip(refused.items(), answers):
        assert code == 2 and said in stderr, (args, stderr)
        assert imported == [], f"uedp {' '.join(args)} imported {imported} before refusing"
    assert answers[-1][0] == 0 and answers[-1][2] == []  # `uedp datasets` answered, importing none of it either


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
