"""``uedp epsilon``'s answers, remembered whole: the same arguments to the same code print the same lines, so
a repeated plan is printed from the data home without importing torch or dp_accounting (about 3 s of
imports before the remembered accounting figures of :mod:`uedp.privacy.accounting.memo` can even be read).

An answer is named by a hash of the command's arguments, uedp's version, dp_accounting's version and the
bytes of every module uedp installs (:func:`source_identity`): any change to the code, an upgrade, or
another argument computes afresh. Only answers that depend on nothing but their arguments are remembered:
not with ``--config`` (a file's contents), not ``--help``, not a failure (exit status other than 0). What
is kept is what the command wrote to stdout and stderr, replayed byte for byte.

Nothing private is here: a plan's arguments and lines are public settings and public figures, kept in the
curator's data home (``<home>/cache/answers``) when one exists, as the accounting figures are.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import Any, TextIO

ANSWERS_VERSION = 1
REMEMBERED_COMMANDS = frozenset({"epsilon"})
# Options whose answer depends on more than the arguments (a file's contents) or that print no plan.
NOT_REMEMBERED_OPTIONS = ("--config", "-c", "--help", "-h")
# Every package uedp installs (pyproject.toml's [tool.setuptools] packages, top level): their modules'
# bytes name an answer. tests/test_remembered_answers.py keeps this equal to pyproject's list.
SOURCE_PACKAGES = ("uedp", "uedp.deployments", "uedp.detection", "uedp.experiments", "uedp.flows", "uedp.models",
                   "uedp.privacy", "uedp.services", "uedp.storage", "uedp.tasks")


def answers_folder() -> Path | None:
    """``<home>/cache/answers`` when the data home (``UEDP_HOME``, else ``.uedp``) exists; None otherwise (a
    plan creates no home)."""
    root = Path(os.environ.get("UEDP_HOME") or ".uedp").expanduser()
    return root / "cache" / "answers" if root.is_dir() else None


def rememberable(args: list[str]) -> bool:
    """Whether ``uedp ARGS`` prints an answer that depends on its arguments alone."""
    if not args or args[0] not in REMEMBERED_COMMANDS:
        return False
    return not any(arg == option or arg.startswith(option + "=") for arg in args[1:] for option in NOT_REMEMBERED_OPTIONS)


def source_identity() -> str:
    """What computes an answer: uedp's and dp_accounting's versions, the Python version and the bytes of every
    module of :data:`SOURCE_PACKAGES` (found where the installation puts them, editable or not)."""
    digest = hashlib.sha256(repr((ANSWERS_VERSION, version("uedp"), version("dp-accounting"),
                                  sys.version_info[:2])).encode())
    for package in SOURCE_PACKAGES:
        spec = find_spec(package)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        if not locations:
            raise RuntimeError(f"package {package} is not installed where an answer's code can be read")
        for folder in locations:
            for source in sorted(Path(folder).rglob("*.py")):
                digest.update(str(source.relative_to(folder)).encode())
                digest.update(source.read_bytes())
    return digest.hexdigest()


def answer_file(folder: Path, args: list[str]) -> Path:
    key = hashlib.sha256(json.dumps([source_identity(), args]).encode()).hexdigest()[:32]
    return folder / f"{args[0]}-{key}.json"


def replay(file: Path, args: list[str]) -> bool:
    """Print the answer remembered in ``file`` for ``args``; False when there is none (or it is damaged or
    another's, which the command then answers afresh and writes over)."""
    try:
        stored = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(stored, dict) or stored.get("args") != args:
        return False
    out, err = stored.get("stdout"), stored.get("stderr")
    if not isinstance(out, str) or not isinstance(err, str):
        return False
    sys.stdout.write(out)
    sys.stdout.flush()
    sys.stderr.write(err)
    sys.stderr.flush()
    return True


class _Tee(io.TextIOBase):
    """Writes go to the real stream and are kept."""

    def __init__(self, stream: TextIO) -> None:
        self.stream, self.kept = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def _teed() -> Iterator[tuple[_Tee, _Tee]]:
    out, err = _Tee(sys.stdout), _Tee(sys.stderr)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def answer(args: list[str], run: Callable[[], Any]) -> None:
    """Run the command (``run``, which exits) or replay its remembered answer; a successful answer to a
    rememberable command is remembered. Exits as the command does."""
    folder = answers_folder() if rememberable(args) else None
    if folder is None:
        run()
        return
    file = answer_file(folder, args)
    if replay(file, args):
        sys.exit(0)
    with _teed() as (out, err):
        try:
            run()
            status: Any = 0
        except SystemExit as exc:
            status = exc.code
    if status in (0, None):
        _write(file, {"args": args, "stdout": out.kept.getvalue(), "stderr": err.kept.getvalue()})
    sys.exit(status)


def _write(file: Path, data: dict[str, Any]) -> None:
    """Atomically; a folder that cannot be written only costs the next call the computation."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=file.name, dir=file.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(data, stream)
        os.replace(temporary, file)
    except OSError:
        pass
