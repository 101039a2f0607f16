"""Budgets across runs: every release from a dataset goes into its privacy ledger
(:mod:`storage.privacy_ledger`), the releases of one privacy unit compose
(:func:`privacy.accounting.compose_guarantees`), and a budget the curator sets is kept.

What is charged, and when (docs/PRIVACY.md, "Several runs on the same data"):

* a training run, before its first round, at the epsilon it plans (the mechanism's own accounting,
  ``planned_epsilon``: its rounds, or up to its ``--max-epsilon`` stop); settled to the epsilon its
  statement reports once training ends. A resumed run continues its entry. An attempt that stopped
  before it finished stays reserved at its planned epsilon: it had released its DP count of units
  (in its noise-to-signal) and may have run rounds, so a new attempt is a new entry;
* a local-DP release (``uedp sanitize``, or custext/santext's first training), at its per-token epsilon,
  once; every run that trains on the release is post-processing of it and costs nothing;
* nothing else: reports, attacks, ``--init-from`` of a trained model and logging it again reuse a
  release. A run without a guarantee (noiseless, deid) is entered with an infinite epsilon under the
  unit "none": it is the reason a ledger's totals cannot be the whole story (``uedp budget`` says so).

Releases compose within one unit *and scope*: an entity-level run protects only the categories it was
given and the entities its detection found, so runs with other categories, or after another detection,
are totals of their own. Units differ in adjacency (a writer, a sequence, a token's value) and are not
combined: a person exposed by releases of several units has no single figure here.

A budget is one epsilon that each such total must stay within; a release that would take its total
past it is refused before it starts (a run without a guarantee always would).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from uedp.errors import UedpError
from uedp.privacy.accounting import compose_guarantees
from uedp.storage.home import DataHome
from uedp.storage.privacy_ledger import FINISHED, RESERVED, LedgerEntry, LedgerState, PrivacyLedger
from uedp.storage.tables import read_manifest

NO_UNIT = "none"  # the unit of runs without a guarantee, as their statements give it


@dataclass(frozen=True)
class UnitTotal:
    """The composed guarantee of every release of one unit and scope."""

    unit: str
    scope: str
    epsilon: float
    delta: float
    releases: int

    @property
    def named(self) -> str:
        return self.unit + (f" [{self.scope}]" if self.scope else "")


@dataclass(frozen=True)
class Release:
    """What one run or local-DP release is about to spend: its entry, before it is filed."""

    key: str  # "run:<id>" or "release:<key>"; empty until the run's MLflow id is known
    mechanism: str
    unit: str
    epsilon: float  # planned: what it states if it runs to the end of its plan
    delta: float
    name: str
    randomness: str
    scope: str = ""  # categories and detected entities, or what a local-DP release sanitized (LedgerEntry)
    fingerprint: str = ""  # the training configuration's

    def entry(self) -> LedgerEntry:
        return LedgerEntry(key=self.key, mechanism=self.mechanism, unit=self.unit, epsilon=self.epsilon,
                           delta=self.delta, status=RESERVED, name=self.name, randomness=self.randomness,
                           scope=self.scope, fingerprint=self.fingerprint)

    @property
    def named(self) -> str:
        return self.unit + (f" [{self.scope}]" if self.scope else "")


def ledger_of(home: DataHome, dataset: str) -> PrivacyLedger:
    return PrivacyLedger(home.dataset_dir(dataset))


def derived_from(home: DataHome, dataset: str) -> str | None:
    """The dataset a local-DP release was drawn from, when ``dataset`` is one (its train split is that
    release: training on it is post-processing, charged to nobody)."""
    manifest = read_manifest(home.table_dir(dataset, "sentences")) or {}
    source = manifest.get("source")
    return str(source.get("dataset")) if isinstance(source, dict) and source.get("dataset") else None


def unit_totals(entries: tuple[LedgerEntry, ...] | list[LedgerEntry]) -> list[UnitTotal]:
    """Each unit and scope's releases composed, in the order they first appear (runs without a guarantee:
    one infinite total under the unit "none")."""
    groups: dict[tuple[str, str], list[LedgerEntry]] = {}
    for entry in entries:
        groups.setdefault((entry.unit, entry.scope), []).append(entry)
    totals = []
    for (unit, scope), group in groups.items():
        epsilon, delta = compose_guarantees([(e.epsilon, e.delta) for e in group])
        totals.append(UnitTotal(unit, scope, epsilon, delta, len(group)))
    return totals


def _others(state: LedgerState, release: Release) -> list[LedgerEntry]:
    """The entries a release adds to: every one but its own (a resumed run's)."""
    return [e for e in state.entries if e.key != release.key]


def _same(others: list[LedgerEntry], release: Release) -> list[LedgerEntry]:
    return [e for e in others if (e.unit, e.scope) == (release.unit, release.scope)]


def _unit_total_with(others: list[LedgerEntry], release: Release) -> UnitTotal:
    same = _same(others, release)
    epsilon, delta = compose_guarantees([(e.epsilon, e.delta) for e in same] + [(release.epsilon, release.delta)])
    return UnitTotal(release.unit, release.scope, epsilon, delta, len(same) + 1)


def refusal(dataset: str, state: LedgerState, release: Release) -> str | None:
    """Why ``release`` may not run under the dataset's budget, or None."""
    if state.limit is None:
        return None
    others = _others(state, release)
    if not math.isfinite(release.epsilon):
        return (f"{dataset!r} has a privacy budget (epsilon {state.limit:g} for each unit) and {release.mechanism} "
                f"has no guarantee: it would exceed it. Train it on public text (another dataset), or remove the "
                f"budget: uedp budget {dataset} --no-limit")
    total = _unit_total_with(others, release)
    if total.epsilon <= state.limit:
        return None
    spent = total.releases - 1
    return (f"{release.name} would take {dataset!r} to epsilon {total.epsilon:.4g} for {release.named} "
            f"({spent} earlier release{'s' if spent != 1 else ''} and this run's {release.epsilon:.4g}), past its "
            f"budget {state.limit:g}: give a smaller --target-epsilon or --max-epsilon, or raise the budget "
            f"(uedp budget {dataset} --limit EPSILON); `uedp budget {dataset}` lists what was spent")


def check(home: DataHome, dataset: str, release: Release) -> None:
    """Refuse, before anything is opened or trained, a release the dataset's budget does not allow."""
    if (why := refusal(dataset, ledger_of(home, dataset).read(), release)) is not None:
        raise UedpError(why)


def file(home: DataHome, dataset: str, release: Release) -> list[str]:
    """File ``release`` (checked again under the ledger's lock: runs in parallel see each other) and
    return what to tell the person who started it: what the dataset had already spent on its unit."""
    with ledger_of(home, dataset).editing() as ledger:
        if ledger.state.entry(release.key) is not None:  # a resumed run: charged when it started
            return []
        if (why := refusal(dataset, ledger.state, release)) is not None:
            raise UedpError(why)
        others = _others(ledger.state, release)
        ledger.add(release.entry())
    return _spent_lines(dataset, others, release)


def settle(home: DataHome, dataset: str, release: Release, epsilon: float, delta: float) -> None:
    """The release is done, at the epsilon its statement gives (at most the planned one)."""
    with ledger_of(home, dataset).editing() as ledger:
        ledger.settle(release.entry(), epsilon, delta)


def drop(home: DataHome, dataset: str, key: str) -> None:
    """Withdraw a reservation whose release was never made (a local-DP draw that failed: nothing written)."""
    with ledger_of(home, dataset).editing() as ledger:
        if ledger.state.entry(key) is not None:
            ledger.drop(key)


@contextmanager
def reserved(home: DataHome, dataset: str, release: Release) -> Iterator[list[str]]:
    """A local-DP release's reservation for as long as it is being drawn: settled when the block ends,
    withdrawn if it fails (a failed release writes nothing)."""
    lines = file(home, dataset, release)
    try:
        yield lines
    except BaseException:
        drop(home, dataset, release.key)
        raise
    settle(home, dataset, release, release.epsilon, release.delta)


def _spent_lines(dataset: str, others: list[LedgerEntry], release: Release) -> list[str]:
    same = _same(others, release)
    if not same or not math.isfinite(release.epsilon):
        return []
    before = unit_totals(same)[0]
    after = _unit_total_with(others, release)
    return [f"warning: {dataset!r} has already spent epsilon {before.epsilon:.4g} (delta {before.delta:.3g}) on "
            f"{release.named}, over {len(same)} release{'s' if len(same) != 1 else ''}; this run adds up to "
            f"{release.epsilon:.4g}: {after.epsilon:.4g} (delta {after.delta:.3g}) in all. Each run's epsilon is for "
            f"that run alone; `uedp budget {dataset}` lists them and sets a limit"]


def finished(entry: LedgerEntry) -> bool:
    return entry.status == FINISHED
