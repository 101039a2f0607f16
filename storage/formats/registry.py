"""The corpus format registry: every format module describes itself here (as mechanisms do in
:mod:`uedp.privacy.mechanisms.registry`), and ingest, its options' checks, the CLI's help and the Prefect
form iterate over it instead of naming formats. Adding a format is one module that calls
:func:`register_format`, listed in :data:`MODULES`, plus its tests.

The modules in :data:`MODULES` are imported on first use of the registry; a format registered from
anywhere else (a plugin, a test) is used the same way once its module has run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uedp.errors import UedpError
from uedp.storage.formats import SourceRecord

# The modules of this package that register uedp's own formats, in listing order (help, errors, forms).
MODULES: tuple[str, ...] = ("conll", "agnews", "sec", "wikitext", "tabular", "simdial", "reuters")
PACKAGE = "uedp.storage.formats"


@dataclass(frozen=True)
class CorpusFormat:
    """A corpus format: how to read one of its files, and who its users are.

    ``read`` and ``check`` receive the ingest's options (:class:`uedp.storage.ingest.IngestOptions`; typed
    ``Any`` here because that model validates against this registry).
    """

    name: str
    summary: str  # one line, for --help and the Prefect form
    read: Callable[[Path, Any], Iterator[SourceRecord]]  # (file, options) -> its records, streamed
    default_users: str  # the user strategy when none is given: the one the format's paper uses, where there is one
    fixed_users: bool = False  # the format's files say who the users are: no other strategy is accepted
    gold: bool = False  # its files carry entity tags (what the ``gold`` detector reads)
    # Refuses options that cannot work for this format, raising UedpError with a message naming the flag.
    check: Callable[[Any], None] | None = None
    # How a dataset of this format gets more users (or no user holding most of the text), in options this
    # format accepts: said by ingest's and training's warnings. None: pseudo-users (CHUNK_FIX).
    more_users: str | None = None
    # The files of this format in a folder given to ingest (glob patterns, relative to the folder): a
    # folder stands for its matching files, sorted; the rest (a README, a SOURCE.txt) is left alone.
    file_patterns: tuple[str, ...] = ("*",)

    @property
    def user_fix(self) -> str:
        """What to change when a dataset's users are too few or too unequal for user-level DP."""
        return self.more_users or CHUNK_FIX


CHUNK_FIX = "ingest again with --users chunk:N (pseudo-users of N consecutive records)"


_FORMATS: dict[str, CorpusFormat] = {}
_ORDER: dict[str, tuple[int, int]] = {}  # name -> (index of its module in MODULES, else after them; registration)
_DISCOVERED = False


def register_format(corpus_format: CorpusFormat) -> CorpusFormat:
    """Add a format; its module calls this at import. A name can be registered once."""
    name = corpus_format.name
    if name in _FORMATS and _FORMATS[name] is not corpus_format:
        raise ValueError(f"corpus format {name!r} is registered twice")
    if name not in _FORMATS:
        package, _, module = str(getattr(corpus_format.read, "__module__", "")).rpartition(".")
        listed = package == PACKAGE and module in MODULES
        _ORDER[name] = (MODULES.index(module) if listed else len(MODULES), len(_ORDER))
    _FORMATS[name] = corpus_format
    return corpus_format


def unregister_format(name: str) -> None:
    """Remove a format registered from outside :data:`MODULES` (a test's, a plugin being unloaded)."""
    _FORMATS.pop(name, None)
    _ORDER.pop(name, None)


def _discover() -> None:
    global _DISCOVERED
    if not _DISCOVERED:
        for module in MODULES:
            importlib.import_module(f"{PACKAGE}.{module}")
        _DISCOVERED = True


def formats() -> dict[str, CorpusFormat]:
    """Every registered format, uedp's own first (in :data:`MODULES` order), then the others as registered."""
    _discover()
    return {name: _FORMATS[name] for name in sorted(_FORMATS, key=_ORDER.__getitem__)}


def user_fix(name: str) -> str:
    """:attr:`CorpusFormat.user_fix` of a format by name; a generic line for a format not registered here."""
    known = formats()
    return known[name].user_fix if name in known else "a corpus with more writers"


def format_names() -> tuple[str, ...]:
    return tuple(formats())


def get_format(name: str) -> CorpusFormat:
    known = formats()
    if name not in known:
        raise UedpError(f"unknown format {name!r}; valid: {', '.join(known)}")
    return known[name]


def looks_like_json(path: Path) -> bool:
    """Whether a file of a format with a JSON and a CSV or raw form is the JSON one, by its name
    (``train.jsonl``, ``filings.json.gz``)."""
    name = path.name.lower()
    return ".jsonl" in name or ".json" in name
