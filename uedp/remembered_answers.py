"""``uedp epsilon``'s answers, remembered whole: the same arguments to the same code print the same lines, so
a repeated plan is printed from the data home without importing torch or dp_accounting (about 3 s of
imports before the remembered accounting figures of :mod:`uedp.privacy.accounting.memo` can even be read).

An answer is named by a hash of the command's arguments, the versions of uedp, dp_accounting, numpy and
scipy, the bytes of every module uedp installs (:func:`source_identity`), and what a plan reads besides
(:func:`read_inputs`: the category variables and the data home's labels file): any change to the code, an
upgrade, or another argument computes afresh. Only answers that depend on nothing but their arguments are remembered:
not with ``--config`` (a file's contents), not ``--help``, not a failure (exit status other than 0). What
is kept is what the command wrote to stdout and stderr, in order, replayed byte for byte. Delete
``<home>/cache/answers`` to forget them all.

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
from collections.abc import Callable, Iterator
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import Any, TextIO

from uedp.privacy.accounting.memo import write_cache_entry

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


# Distributions whose versions can move a figure or a check (the accountant and the numerics under it).
ACCOUNTING_DISTRIBUTIONS = ("uedp", "dp-accounting", "numpy", "scipy")
# What a plan reads besides its arguments: the entity categories a configuration's defaults are checked
# against (detection/categories.py: these variables and the data home's labels file).
READ_ENVIRONMENT = ("UEDP_CATEGORIES", "UEDP_LABELS")


def source_identity() -> str:
    """What computes an answer: the versions of :data:`ACCOUNTING_DISTRIBUTIONS`, the Python version and the
    bytes of every module of :data:`SOURCE_PACKAGES` (found where the installation puts them, editable or
    not)."""
    digest = hashlib.sha256(repr((ANSWERS_VERSION, [version(name) for name in ACCOUNTING_DISTRIBUTIONS],
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


def read_inputs(folder: Path) -> list[str]:
    """What a plan reads besides its arguments and code: :data:`READ_ENVIRONMENT` and the data home's labels
    file (``<home>/labels.yaml``, beside ``cache/answers``)."""
    labels = folder.parent.parent / "labels.yaml"
    try:
        labels_text = labels.read_text(encoding="utf-8")
    except OSError:
        labels_text = ""
    return [*(os.environ.get(name, "") for name in READ_ENVIRONMENT), labels_text]


def answer_file(folder: Path, args: list[str]) -> Path:
    key = hashlib.sha256(json.dumps([source_identity(), read_inputs(folder), args]).encode()).hexdigest()[:32]
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
    writes = stored.get("writes")
    if not isinstance(writes, list) or not all(
            isinstance(w, list) and len(w) == 2 and w[0] in ("stdout", "stderr") and isinstance(w[1], str)
            for w in writes):
        return False
    for stream, text in writes:  # in the order the command wrote them
        target = sys.stdout if stream == "stdout" else sys.stderr
        target.write(text)
        target.flush()
    return True


class _Tee(io.TextIOBase):
    """Writes go to the real stream and are kept, with which stream, in one list for both."""

    def __init__(self, stream: TextIO, name: str, kept: list[list[str]]) -> None:
        self.stream, self.name, self.kept = stream, name, kept

    def write(self, text: str | bytes) -> int:  # click may hand bytes through
        shown = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        self.kept.append([self.name, shown])
        return self.stream.write(shown)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def _teed() -> Iterator[list[list[str]]]:
    kept: list[list[str]] = []
    with contextlib.redirect_stdout(_Tee(sys.stdout, "stdout", kept)), \
            contextlib.redirect_stderr(_Tee(sys.stderr, "stderr", kept)):
        yield kept


def answer(args: list[str], run: Callable[[], Any]) -> None:
    """Run the command (``run``, which exits) or replay its remembered answer; a successful answer to a
    rememberable command is remembered. Exits as the command does."""
    folder = answers_folder() if rememberable(args) else None
    try:
        file = answer_file(folder, args) if folder is not None else None
    except Exception:  # what names an answer could not be read: the command answers, unremembered
        file = None
    if file is None:
        run()
        return
    if replay(file, args):
        sys.exit(0)
    with _teed() as kept:
        try:
            run()
            status: Any = 0
        except SystemExit as exc:
            status = exc.code
    if status in (0, None):
        write_cache_entry(file, {"args": args, "writes": kept})
    sys.exit(status)
