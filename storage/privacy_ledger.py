"""A dataset's privacy ledger: every release uedp made from the dataset's private text, in one file in the
data home (``datasets/<name>/privacy_ledger.json``), and the budget its curator set for it.

Each run's epsilon is for that run alone; the people whose text a dataset holds are exposed by all of
them. The ledger is what lets uedp say so: training and local-DP releases add an entry before they
spend anything (at the epsilon they plan), and settle it to the epsilon they state when they finish.
An entry is keyed by what was released (an MLflow run, a local-DP release), so resuming a run or
reusing a release adds nothing. Composing the entries is the services' job
(:mod:`services.privacy_budget`); this module only reads and writes the file, one writer at a time
(an advisory lock beside it: a sweep's tasks train in parallel) and atomically (a temporary file
renamed over the old one, so a crash leaves the previous ledger whole).

Everything in the file is already released (epsilons, run ids and names, settings): it holds no count
and no text of the private data.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from uedp.errors import UedpError

LEDGER_FILE = "privacy_ledger.json"
# 2: entries record the text they released from and their categories; 3: post-processing entries; 4: entries
# record their unit's key
VERSION = 4

# An entry's status: "reserved" from before the first round until training ends (counted at the
# planned epsilon: the run may still finish or resume, and an attempt that stopped had already released
# its DP count and may have run rounds), then "finished" (at the epsilon its statement reports).
RESERVED, FINISHED = "reserved", "finished"


@dataclass(frozen=True)
class LedgerEntry:
    """One release from the dataset's private text."""

    key: str  # what was released: "run:<MLflow run id>" or "release:<local-DP release key>"
    mechanism: str  # as reports show it (uedp-bounded-k4)
    unit: str  # the privacy unit in the words of the run's statement (shown; totals group by ``unit_key``)
    # What else decides which units are protected: the categories and the detected entities (an entity
    # run protects only the entities its table holds), or what a local-DP release sanitized. Empty: nothing.
    epsilon: float  # inf: a release without a guarantee
    delta: float
    status: str = RESERVED
    name: str = ""  # the run's name, or the released dataset's
    randomness: str = "secure"  # seeded: the guarantee does not hold against anyone who knows the seed
    scope: str = ""  # in words, for people: the categories and the entities table, or what a release sanitized
    fingerprint: str = ""  # the training configuration's (to find its runs; two attempts are two entries)
    # The keyed id of the text released from (services.lineage.text_lineage's first): entries of one text
    # compose, whatever dataset name holds it. Empty in entries an older uedp wrote: the ledger's own text.
    text: str = ""
    categories: tuple[str, ...] = ()  # an entity- or token-level release's chosen categories
    # A release that is post-processing of another (a synthetic corpus sampled from a run's model): the key
    # of the release it came from. It states that release's guarantee and adds nothing to any total.
    covered_by: str = ""
    # The unit's canonical key (adjacency and kind, from the mechanism registry: "replace-one:sensitive-token-value"):
    # entries of one key and one text compose, however their statements word the unit. Empty in entries an
    # older uedp wrote: the services derive it from the entry's mechanism (services.privacy_budget.unit_key).
    unit_key: str = ""
    when: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "epsilon": _number(self.epsilon), "categories": list(self.categories)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LedgerEntry:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, "epsilon": float(known["epsilon"]), "delta": float(known["delta"]),
                      "categories": tuple(str(c) for c in known.get("categories", ()))})


@dataclass(frozen=True)
class LedgerState:
    """The ledger as read: its entries in the order they were added, and the budget (None: no limit)."""

    entries: tuple[LedgerEntry, ...] = ()
    limit: float | None = None

    def entry(self, key: str) -> LedgerEntry | None:
        return next((e for e in self.entries if e.key == key), None)


class PrivacyLedger:
    """The ledger file of one dataset. Read it with :meth:`read`; change it inside :meth:`editing`, which
    holds the lock from the read to the write, so a check and the entry it allows are one step."""

    def __init__(self, dataset_dir: Path):
        self.path = dataset_dir / LEDGER_FILE
        self._lock_path = dataset_dir / (LEDGER_FILE + ".lock")

    def read(self) -> LedgerState:
        if not self.path.exists():
            return LedgerState()
        try:
            data = json.loads(self.path.read_text())
            entries = tuple(LedgerEntry.from_json(e) for e in data.get("entries", []))
            limit = data.get("limit")
            return LedgerState(entries, None if limit is None else float(limit))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise UedpError(f"{self.path}: not a uedp privacy ledger ({exc}); it records every release from this "
                            "dataset: restore it from a backup rather than deleting it") from None

    @contextlib.contextmanager
    def editing(self) -> Iterator[LedgerEditor]:
        """The ledger under lock; what the editor holds at the end is written atomically (nothing, if the
        block raised)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                editor = LedgerEditor(self.read())
                yield editor
                if editor.changed:
                    self._write(editor.state)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, state: LedgerState) -> None:
        data = {"version": VERSION, "limit": state.limit, "entries": [e.as_json() for e in state.entries]}
        handle, temporary = tempfile.mkstemp(prefix=LEDGER_FILE, dir=self.path.parent)
        try:
            with os.fdopen(handle, "w") as out:
                json.dump(data, out, indent=1)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


class LedgerEditor:
    """Changes to a ledger read under its lock."""

    def __init__(self, state: LedgerState):
        self.state, self.changed = state, False

    def add(self, entry: LedgerEntry) -> None:
        if self.state.entry(entry.key) is not None:
            raise ValueError(f"{entry.key} is already in the ledger")
        self._set(replace(self.state, entries=(*self.state.entries, entry)))

    def drop(self, key: str) -> None:
        self._set(replace(self.state, entries=tuple(e for e in self.state.entries if e.key != key)))

    def settle(self, entry: LedgerEntry, epsilon: float, delta: float) -> None:
        """The release finished, at the epsilon it states (never above what it planned). An entry someone
        removed from the file is put back: the release happened."""
        if self.state.entry(entry.key) is None:
            self.add(entry)
        entries = tuple(replace(e, epsilon=epsilon, delta=delta, status=FINISHED) if e.key == entry.key else e
                        for e in self.state.entries)
        self._set(replace(self.state, entries=entries))

    def set_limit(self, limit: float | None) -> None:
        self._set(replace(self.state, limit=limit))

    def _set(self, state: LedgerState) -> None:
        self.state, self.changed = state, True


def _number(value: float) -> float | str:
    return "inf" if value == float("inf") else value
