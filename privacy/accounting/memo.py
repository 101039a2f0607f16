"""Accounting figures remembered by their exact arguments: in this process, and in a folder that processes
share (``UEDP_ACCOUNTING_CACHE``; the CLI points it into the data home).

A calibration or an epsilon is a pure function of public arguments (the round's ``DpEvent``, the rounds,
delta, the accountant, the target), and dp_accounting takes seconds to compute one: every ``uedp train``
with a target, every sweep configuration and every ``uedp epsilon`` used to pay that again. Remembering
changes no figure: a remembered value is the one the same code computed for the same arguments, which
are stored with it (``repr`` of each, dp_accounting's events included) and hashed into its name, with
dp_accounting's version and the bytes of the code that computes it (:func:`code_identity`): an upgrade or
a fix starts afresh. Failures (a target met at the least noise searched) are not remembered. The folder
is trusted as the data home is: whoever can write it can write the data too.

Nothing private is here: the arguments are a run's public settings, and the folder is the curator's.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any, TypeVar

CACHE_ENV = "UEDP_ACCOUNTING_CACHE"  # a folder shared by processes; unset: this process only
MEMO_VERSION = 1

_MEMORY: dict[str, Any] = {}
T = TypeVar("T")


@functools.cache
def code_identity() -> str:
    """What computes the figures: dp_accounting's version and the bytes of this package's modules. A figure
    remembered by other code (an upgrade, a fix) is never served: its name differs."""
    digest = hashlib.sha256(version("dp-accounting").encode())
    for source in sorted(Path(__file__).resolve().parent.glob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def memo_key(namespace: str, arguments: tuple[Any, ...]) -> str:
    """The name a figure is remembered by: its namespace and a hash of its arguments' reprs and of the code
    that computes it (:func:`code_identity`)."""
    text = repr((MEMO_VERSION, code_identity(), namespace, arguments))
    return f"{namespace}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


def remembered(namespace: str, arguments: tuple[Any, ...], compute: Callable[[], T]) -> T:
    """``compute()``, or what it returned before for the same ``arguments`` (each with an exact ``repr``:
    floats, strings, dp_accounting events). Values must survive JSON (numbers, lists, dicts of them)."""
    key = memo_key(namespace, arguments)
    if key in _MEMORY:
        return _MEMORY[key]  # type: ignore[no-any-return]
    folder = _folder()
    if folder is not None:
        stored = _read(folder / f"{key}.json", repr(arguments))
        if stored is not None:
            _MEMORY[key] = stored
            return stored  # type: ignore[no-any-return]
    value = compute()
    _MEMORY[key] = value
    if folder is not None:
        write_cache_entry(folder / f"{key}.json", {"arguments": repr(arguments), "value": value})
    return value


def forget() -> None:
    """Drop what this process remembers (the shared folder is kept): for tests that time or compare a
    first computation."""
    _MEMORY.clear()


def _folder() -> Path | None:
    raw = os.environ.get(CACHE_ENV, "")
    return Path(raw) if raw else None


def _read(file: Path, arguments: str) -> Any:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent, or unreadable: computed again and written over
    if not isinstance(data, dict) or data.get("arguments") != arguments:
        return None  # another figure under the same name (a hash collision): never taken for this one
    value = data.get("value")
    return value if _finite(value) else None


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return isinstance(value, (int, str))


def write_cache_entry(file: Path, data: dict[str, Any]) -> None:
    """Write a cache entry as JSON, atomically (a temporary file renamed over it, removed on failure); a folder
    that cannot be written to only costs the next process the computation, so failures are not raised.
    Shared by the remembered answers of :mod:`uedp.remembered_answers`."""
    temporary = ""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=file.name, dir=file.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(data, out)
        os.replace(temporary, file)
    except OSError:
        if temporary:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
