"""Budgets across runs: every release from a dataset goes into its privacy ledger
(:mod:`storage.privacy_ledger`), the releases of one privacy unit of one text compose
(:func:`privacy.accounting.composition.compose_guarantees`), and a budget the curator sets is kept.

What is charged, and when (docs/PRIVACY.md, "Several runs on the same data"):

* a training run, before its first round, at the epsilon it plans (the mechanism's own accounting,
  ``planned_epsilon``: its rounds, or up to its ``--max-epsilon`` stop); settled to the epsilon its
  statement reports once training ends. A resumed run continues its entry. An attempt that stopped
  before it finished stays reserved at its planned epsilon: it had released its DP count of units
  (in its noise-to-signal) and may have run rounds, so a new attempt is a new entry;
* a local-DP release (``uedp sanitize``, or custext/santext's first training), at its per-token epsilon,
  once; every run that trains on the release is post-processing of it and costs nothing;
* a synthetic corpus (``uedp generate``) is entered as post-processing of the run it was sampled from
  (``covered_by``): listed, at that run's figures, and in no total;
* nothing else: reports, attacks, ``--init-from`` of a trained model and logging it again reuse a
  release.

What composes: every release of one unit **from one text**, whatever dataset name holds that text (the
same sentences ingested under another name or split are one text: :mod:`services.lineage`; so is a text
that shares the sentences of either one's train split, a copy of part of it or a superset:
:mod:`services.text_overlap`), and whatever
categories or detection an entity- or token-level release used. One entity is one unit whatever category
a detector gave it ("Leeds" as GPE and as LOC; homonyms share a unit), so a run with PER and a run with LOC
can both expose it, and per-category totals would undercount it; composing them all errs towards counting
too much. A unit is its canonical key (:func:`unit_key`: the adjacency and kind the mechanism registry states,
``replace-one:sensitive-token-value``), never a statement's wording: selective on GPT-2 ("one sensitive
token's value") and on an LSTM with the byte tokenizer ("one byte's value inside a detected sensitive span")
are one unit and one total. Units differ in adjacency (a writer, a sequence, a token's value) and are not
combined: a person exposed by releases of several units has no single figure here.

Releases that bound nothing are kept out of the totals and said apart: runs without a guarantee
(noiseless, deid: the unit "none") and seeded runs, whose noise anyone who knows the seed (logged with the
run) can recompute. A budget is one epsilon that each total must stay within; a release that would take
its total past it is refused before it starts, and so is any release that bounds nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from uedp.errors import UedpError
from uedp.privacy.accounting.composition import compose_guarantees
from uedp.privacy.mechanisms import registry
from uedp.services.lineage import text_lineage
from uedp.services.text_overlap import shares_train_text
from uedp.storage.home import DataHome
from uedp.storage.manifests import sentences_manifest
from uedp.storage.privacy_ledger import FINISHED, LEDGER_FILE, RESERVED, LedgerEntry, LedgerState, PrivacyLedger

NO_UNIT = "none"  # the unit of runs without a guarantee, as their statements give it
SEEDED = "seeded"


@dataclass(frozen=True)
class UnitTotal:
    """The composed guarantee of every release of one unit from one text."""

    unit: str  # the unit's readable name (the registry's for its key)
    epsilon: float
    delta: float
    releases: int
    categories: tuple[str, ...] = ()  # entity- and token-level releases: every category any of them chose
    mixed: bool = False  # its releases chose different categories or detections (composed all the same)
    key: str = ""  # the unit's canonical key, what the total groups by (unit_key)
    wordings: tuple[str, ...] = ()  # how its releases' statements word the unit, each once

    @property
    def named(self) -> str:
        return self.unit + (f" [categories {','.join(self.categories)}]" if self.categories else "")


@dataclass(frozen=True)
class Charge:
    """What one run or local-DP release is about to spend from the ledger: its entry, before it is filed."""

    key: str  # "run:<id>" or "release:<key>"; empty until the run's MLflow id is known
    mechanism: str
    unit: str
    epsilon: float  # planned: what it states if it runs to the end of its plan
    delta: float
    name: str
    randomness: str
    scope: str = ""  # in words: categories and detected entities, or what a local-DP release sanitized
    fingerprint: str = ""  # the training configuration's
    text: str = ""  # the keyed id of the text it releases from (text_of)
    categories: tuple[str, ...] = ()
    unit_key: str = ""  # the unit's canonical key; empty: the registry's for ``mechanism`` (unit_key)

    def entry(self) -> LedgerEntry:
        return LedgerEntry(key=self.key, mechanism=self.mechanism, unit=self.unit, epsilon=self.epsilon,
                           delta=self.delta, status=RESERVED, name=self.name, randomness=self.randomness,
                           scope=self.scope, fingerprint=self.fingerprint, text=self.text,
                           categories=self.categories, unit_key=unit_key(self))


@dataclass(frozen=True)
class LedgerView:
    """Every release from one text that a dataset's budget must see: its own ledger's entries and those of
    every other dataset of the data home released from the same text (``origin``: the dataset whose ledger
    holds each entry), with the strictest budget set on a dataset that holds the text."""

    entries: tuple[LedgerEntry, ...] = ()
    limit: float | None = None
    origin: dict[str, str] = field(default_factory=dict)  # entry key -> the dataset whose ledger holds it
    limited_by: str = ""  # the dataset whose budget ``limit`` is

    def others(self, charge: Charge) -> list[LedgerEntry]:
        """The entries a release adds to: every one but its own (a resumed run's)."""
        return [e for e in self.entries if e.key != charge.key]


def ledger_of(home: DataHome, dataset: str) -> PrivacyLedger:
    return PrivacyLedger(home.dataset_dir(dataset))


def derived_from(home: DataHome, dataset: str) -> str | None:
    """The dataset a local-DP release was drawn from, when ``dataset`` is one (its train split is that
    release: training on it is post-processing, charged to nobody)."""
    manifest = sentences_manifest(home, dataset)
    return manifest.derived_from if manifest is not None else None


def text_of(home: DataHome, dataset: str) -> str:
    """The keyed id of the text a dataset holds (empty before it is ingested)."""
    return next(iter(text_lineage(home, dataset)), "")


def view(home: DataHome, dataset: str, own: LedgerState | None = None) -> LedgerView:
    """What ``dataset``'s budget sees (``own``: its ledger as already read under its lock): every entry of
    its own ledger, and every entry of another dataset's ledger released from the same text: the same
    sentences under any name or split, or a text that shares the sentences of either one's train split (a
    copy of this train split, of part of it, or a superset: :mod:`services.text_overlap`). An entry an
    older uedp wrote records no text: it counts as its ledger's dataset's text now. The budget is the
    smallest one set on a dataset that holds this text."""
    text = text_of(home, dataset)
    states = {dataset: own if own is not None else ledger_of(home, dataset).read()}
    root = home.datasets_dir
    for folder in sorted(root.iterdir()) if root.is_dir() and text else ():
        if folder.name != dataset and (folder / LEDGER_FILE).is_file():
            states[folder.name] = ledger_of(home, folder.name).read()
    texts = {name: text if name == dataset else text_of(home, name) for name in states}
    related: dict[tuple[str, str], bool] = {}

    def same_text(name: str, other: str) -> bool:
        """Whether ``other``, a text released from dataset ``name``, is this dataset's text."""
        if other == text:
            return True
        if (name, other) not in related:
            related[name, other] = (shares_train_text(home, dataset, [other])
                                    or (other == texts[name] and shares_train_text(home, name, [text])))
        return related[name, other]

    entries, origin = [], {}
    for name, state in states.items():
        for entry in state.entries:
            if name == dataset or same_text(name, entry.text or texts[name]):
                entries.append(entry)
                origin[entry.key] = name
    limits = [(state.limit, name) for name, state in states.items()
              if state.limit is not None and (name == dataset or same_text(name, texts[name]))]
    limit, by = min(limits) if limits else (None, "")
    return LedgerView(tuple(entries), limit, origin, by)


def bounds_nothing(entry: LedgerEntry | Charge) -> bool:
    """A release no total can include: no guarantee (noiseless, deid), or seeded (its noise can be recomputed
    by anyone who knows the seed, which is logged with it)."""
    return entry.unit == NO_UNIT or not math.isfinite(entry.epsilon) or entry.randomness == SEEDED


WORDED = "as worded:"  # the key of a unit the registry does not describe: its statement's words


def unit_key(entry: LedgerEntry | Charge) -> str:
    """The canonical key of an entry's unit, what totals group by: the one it was filed with, or, for an entry
    an older uedp wrote (no key) or a release not yet filed, the registry's structured unit of its mechanism
    (:func:`registry.unit_of`: the adjacency and kind, whatever the statement's wording), or, for a mechanism
    no longer registered, that of the registered one worded as its entry. Otherwise (a mechanism stating no
    structured unit) the statement's wording is the key: its releases compose with those worded the same,
    as before keys existed."""
    if entry.unit_key:
        return entry.unit_key
    unit = registry.unit_of(entry.mechanism, entry.unit)
    return unit.key if unit is not None else WORDED + entry.unit


def unit_name(entry: LedgerEntry | Charge) -> str:
    """The readable name of an entry's unit: the registry's for its key, or the entry's own wording."""
    unit = registry.unit_of(entry.mechanism, entry.unit)
    return unit.name if unit is not None and unit.key == unit_key(entry) else entry.unit


def unit_totals(entries: Sequence[LedgerEntry]) -> list[UnitTotal]:
    """Each unit's releases composed, grouped by :func:`unit_key` (never by wording), in the order the units
    first appear, leaving out those that bound nothing (:func:`bounds_nothing`). ``entries`` are one text's
    (a :class:`LedgerView`'s)."""
    groups: dict[str, list[LedgerEntry]] = {}
    for entry in entries:
        if not bounds_nothing(entry) and not entry.covered_by:
            groups.setdefault(unit_key(entry), []).append(entry)
    return [_total(group) for group in groups.values()]


def _total(group: Sequence[LedgerEntry | Charge]) -> UnitTotal:
    epsilon, delta = compose_guarantees([(e.epsilon, e.delta) for e in group])
    categories = tuple(sorted({c for e in group for c in e.categories}))
    mixed = len({(tuple(e.categories), e.scope) for e in group if e.categories}) > 1
    return UnitTotal(unit_name(group[0]), epsilon, delta, len(group), categories, mixed, unit_key(group[0]),
                     tuple(dict.fromkeys(e.unit for e in group)))


def _same(others: list[LedgerEntry], charge: Charge) -> list[LedgerEntry]:
    key = unit_key(charge)
    return [e for e in others if unit_key(e) == key and not bounds_nothing(e) and not e.covered_by]


def _unit_total_with(others: list[LedgerEntry], charge: Charge) -> UnitTotal:
    return _total([*_same(others, charge), charge])


def refusal(dataset: str, seen: LedgerView, charge: Charge) -> str | None:
    """Why ``charge`` may not run under the budget ``dataset`` sees, or None."""
    if seen.limit is None:
        return None
    where = seen.limited_by or dataset
    set_on = f", set on {where!r}, which holds the same text" if where != dataset else ""
    if bounds_nothing(charge):
        why = ("it is seeded: anyone who knows the seed, which is logged with the run, can recompute its noise. Drop "
               "--seeded (secure randomness is the default)" if math.isfinite(charge.epsilon) and
               charge.unit != NO_UNIT else "it has no guarantee. Train it on public text (another dataset)")
        return (f"{dataset!r} has a privacy budget (epsilon {seen.limit:g} for each unit{set_on}) and "
                f"{charge.mechanism} would exceed it: {why}, or remove the budget: uedp budget {where} --no-limit")
    total = _unit_total_with(seen.others(charge), charge)
    if total.epsilon <= seen.limit:
        return None
    spent = total.releases - 1
    return (f"{charge.name} would take {dataset!r} to epsilon {total.epsilon:.4g} for {total.unit} "
            f"({spent} earlier release{'s' if spent != 1 else ''} of its text and this run's {charge.epsilon:.4g}), "
            f"past its budget {seen.limit:g}{set_on}: give a smaller --target-epsilon or --max-epsilon, or raise the "
            f"budget (uedp budget {where} --limit EPSILON); `uedp budget {dataset}` lists what was spent")


def check(home: DataHome, dataset: str, charge: Charge) -> None:
    """Refuse, before anything is opened or trained, a release the dataset's budget does not allow."""
    if (why := refusal(dataset, view(home, dataset), charge)) is not None:
        raise UedpError(why)


def file(home: DataHome, dataset: str, charge: Charge) -> list[str]:
    """File ``charge`` (checked again under the ledger's lock: runs in parallel see each other) and
    return what to tell the person who started it: what its text had already spent on its unit."""
    with ledger_of(home, dataset).editing() as ledger:
        if ledger.state.entry(charge.key) is not None:  # a resumed run: charged when it started
            return []
        seen = view(home, dataset, ledger.state)
        if (why := refusal(dataset, seen, charge)) is not None:
            raise UedpError(why)
        ledger.add(charge.entry())
    return _spent_lines(dataset, seen.others(charge), charge)


def settle(home: DataHome, dataset: str, charge: Charge, epsilon: float, delta: float) -> None:
    """The charged run or release is done: its entry now holds the epsilon its statement gives (at most the planned one)."""
    with ledger_of(home, dataset).editing() as ledger:
        ledger.settle(charge.entry(), epsilon, delta)


def drop(home: DataHome, dataset: str, key: str) -> None:
    """Withdraw a reservation whose release was never made (a local-DP draw that failed: nothing written)."""
    with ledger_of(home, dataset).editing() as ledger:
        if ledger.state.entry(key) is not None:
            ledger.drop(key)


@contextmanager
def reserved(home: DataHome, dataset: str, charge: Charge) -> Iterator[list[str]]:
    """A local-DP release's reservation for as long as it is being drawn: settled when the block ends,
    withdrawn if it fails (a failed release writes nothing)."""
    lines = file(home, dataset, charge)
    try:
        yield lines
    except BaseException:
        drop(home, dataset, charge.key)
        raise
    settle(home, dataset, charge, charge.epsilon, charge.delta)


def _spent_lines(dataset: str, others: list[LedgerEntry], charge: Charge) -> list[str]:
    same = _same(others, charge)
    if not same or bounds_nothing(charge):
        return []
    before = _total(same)
    after = _unit_total_with(others, charge)
    return [f"warning: {dataset!r} has already spent epsilon {before.epsilon:.4g} (delta {before.delta:.3g}) on "
            f"{before.unit}, over {len(same)} release{'s' if len(same) != 1 else ''} of its text; this run adds up "
            f"to {charge.epsilon:.4g}: {after.epsilon:.4g} (delta {after.delta:.3g}) in all. Each run's epsilon is "
            f"for that run alone; `uedp budget {dataset}` lists them and sets a limit"]


def file_post_processing(home: DataHome, dataset: str, entry: LedgerEntry) -> bool:
    """Enter a release that is post-processing of ``entry.covered_by`` (no budget can refuse it: it spends
    nothing). False when the ledger already holds it (the same corpus generated again is reused)."""
    if not entry.covered_by:
        raise ValueError(f"{entry.key}: a post-processing entry names the release it came from")
    with ledger_of(home, dataset).editing() as ledger:
        if ledger.state.entry(entry.key) is not None:
            return False
        ledger.add(replace(entry, status=FINISHED))
    return True


def finished(entry: LedgerEntry) -> bool:
    return entry.status == FINISHED
