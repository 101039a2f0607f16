"""Every flag a message suggests exists (issue 68, 4: a warning told users to ingest "with --format jsonl",
but ingest takes its format as an argument and answered "No such option: --format").

Two checks over the string literals of uedp's own modules, read with ``ast`` (messages, help and docstrings):

* a ``uedp COMMAND ...`` in a string: each flag after it, up to the string's end or a closing backtick, is an
  option of that command (a flag that exists only elsewhere does not help there);
* any other flag in a message (not a docstring) is an option of some uedp command, of the script the
  file itself parses (argparse), or one of the other programs' flags listed below, each with its program.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import typer.main

from support import REPO

FOLDERS = ("services", "storage", "privacy", "flows", "tasks", "uedp", "experiments", "detection", "models",
           "deployments")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
COMMAND = re.compile(r"\buedp ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)")
# Flags of the programs uedp starts or names, which are theirs and not uedp's.
OTHER_PROGRAMS = {
    "--app-dir": "uvicorn", "--factory": "uvicorn", "--host": "uvicorn, mlflow", "--port": "uvicorn, mlflow",
    "--log-level": "uvicorn", "--lifespan": "uvicorn", "--backend-store-uri": "mlflow server",
    "--artifacts-destination": "mlflow server", "--all": "prefect deploy", "--no-prompt": "prefect deploy",
    "--prefect-file": "prefect deploy", "--pool": "prefect worker", "--type": "prefect work-pool create",
    "--overwrite": "prefect work-pool create", "--no-deps": "pip", "--only-binary": "pip", "--quiet": "pip",
    "--disable-pip-version-check": "pip", "--nproc-per-node": "torchrun", "--standalone": "torchrun",
    "--local-dir": "huggingface-cli download", "--domain": "SimDial's generator", "--help": "every command",
    "--no": "typer's --no-FLAG form (uedp.options)",
}


@cache
def options_by_command() -> dict[str, frozenset[str]]:
    from uedp.commands import app

    out: dict[str, frozenset[str]] = {}

    def walk(command: object, path: str) -> None:
        options = {o for p in getattr(command, "params", []) for o in (*p.opts, *p.secondary_opts)}
        out[path] = frozenset(options | {"--help"})
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())

    walk(typer.main.get_command(app), "")
    return out


def _literals(path: Path) -> list[tuple[int, str, bool]]:
    """(line, text, is a docstring) of every string literal of a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and ast.get_docstring(node, clean=False) is not None}
    return [(node.lineno, node.value, id(node) in docstrings) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def _parsed_here(path: Path) -> set[str]:
    """The flags a script's own argparse parser declares."""
    return set(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", path.read_text(encoding="utf-8")))


def _modules() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((REPO / folder).rglob("*.py"))]


def test_every_flag_after_a_uedp_command_is_that_commands_option() -> None:
    commands = options_by_command()
    wrong = []
    for path in _modules():
        for line, text, _ in _literals(path):
            for match in COMMAND.finditer(text):
                words = match.group(1).split()
                name = " ".join(words) if " ".join(words) in commands else words[0]
                if name not in commands:
                    continue
                rest = text[match.end():].split("`")[0].split("\n")[0]
                wrong += [f"{path.relative_to(REPO)}:{line}: uedp {name} has no {flag}"
                          for flag in FLAG.findall(rest) if flag not in commands[name]]
    assert not wrong, "\n".join(wrong)


def test_every_flag_a_message_suggests_exists_somewhere() -> None:
    known = set().union(*options_by_command().values()) | set(OTHER_PROGRAMS)
    unknown = []
    for path in _modules():
        own = _parsed_here(path)
        for line, text, docstring in _literals(path):
            if docstring:
                continue
            unknown += [f"{path.relative_to(REPO)}:{line}: {flag}" for flag in FLAG.findall(text)
                        if flag not in known and flag not in own]
    assert not unknown, "\n".join(unknown)


def test_the_check_catches_the_flag_ingest_never_had() -> None:
    ingest = options_by_command()["ingest"]
    assert "--format" not in ingest and "--text-col" in ingest and "--users" in ingest
    assert FLAG.findall("ingest that with --format jsonl --text-col text") == ["--format", "--text-col"]


def _verb_flags(text: str, commands: frozenset[str]) -> list[tuple[str, str]]:
    """(command, flag) where a message says to run a command "with" a flag: "ingest that with --text-col"."""
    names = "|".join(sorted((c for c in commands if c and " " not in c), key=len, reverse=True))
    return re.findall(rf"\b({names})\b[^.;:`]{{0,24}}? with (--[a-z0-9-]+)", text)


def test_a_command_a_message_names_with_a_flag_takes_that_flag() -> None:
    commands = options_by_command()
    wrong = []
    for path in _modules():
        for line, text, _ in _literals(path):
            wrong += [f"{path.relative_to(REPO)}:{line}: {name} has no {flag}"
                      for name, flag in _verb_flags(text, frozenset(commands)) if flag not in commands[name]]
    assert not wrong, "\n".join(wrong)
    # the message issue 68 found, as it was: caught
    assert _verb_flags("or convert it to JSON lines and ingest that with --format jsonl --text-col text",
                       frozenset(commands)) == [("ingest", "--format")]
