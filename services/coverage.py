"""Detector coverage against gold tags, stored with the entities table, and the recall that every
entity-level epsilon is printed and logged next to (an epsilon covers only the entities detected, so
recall is a privacy figure).

``coverage.json`` sits in the entities table's folder and names the table's content key: figures of
another table (re-detected since) are recomputed, never reused."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

from uedp.detection.categories import taxonomy
from uedp.storage.catalog import Catalog
from uedp.storage.home import DataHome
from uedp.storage.tables import read_manifest

COVERAGE_FILE = "coverage.json"
HELD_OUT = ("valid", "test")
ANY = "any automatic detector"  # the union of several: a gold span found by any of them is covered
FIELDS = ("class", "gold", "predicted", "exact", "precision", "recall", "overlap_recall")


def compute_coverage(catalog: Catalog) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per scope (``all`` splits, ``held_out``: valid and test), per automatic detector, a row per CoNLL
    class (precision, recall, overlap recall against gold); with several detectors, also their union as
    :data:`ANY`. Empty when there is no gold to compare with."""
    detectors = catalog.detectors()
    if "gold" not in detectors:
        return {}
    coarse = taxonomy().coarse
    automatic = [name for name in detectors if name != "gold"]
    groups = {name: [name] for name in automatic} | ({ANY: automatic} if len(automatic) > 1 else {})
    return {scope: {name: [dict(zip(FIELDS, row)) for row in catalog.coverage(group, coarse, splits=splits)]
                    for name, group in groups.items()}
            for scope, splits in (("all", None), ("held_out", HELD_OUT))}


def store_coverage(home: DataHome, dataset: str) -> None:
    """Write ``coverage.json`` beside a freshly written entities table (atomically)."""
    folder = home.table_dir(dataset, "entities")
    manifest = read_manifest(folder)
    if manifest is None:
        return
    with Catalog(home, dataset) as catalog:
        figures = compute_coverage(catalog)
    partial = folder / f".{COVERAGE_FILE}.{uuid.uuid4().hex[:8]}.tmp"  # concurrent writers never share one
    try:
        partial.write_text(json.dumps({"entities_key": manifest["key"], "coverage": figures}), encoding="utf-8")
        os.replace(partial, folder / COVERAGE_FILE)
    except OSError:  # a read-only data home: the figures are recomputed when asked for
        partial.unlink(missing_ok=True)


def stored_coverage(home: DataHome, dataset: str) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The stored figures of the current entities table (computed and stored when missing or stale)."""
    folder = home.table_dir(dataset, "entities")
    manifest = read_manifest(folder)
    path = folder / COVERAGE_FILE
    if manifest is not None and path.is_file():
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("entities_key") == manifest["key"]:
            return dict(raw["coverage"])
    store_coverage(home, dataset)
    return dict(json.loads(path.read_text(encoding="utf-8"))["coverage"]) if path.is_file() else {}


@dataclass(frozen=True)
class DetectorRecall:
    """The recall an entity-level epsilon's coverage rests on, and how it was obtained."""

    value: float | None  # None: not measured (or nothing to measure: gold tags only)
    how: str  # "gold only", "held-out gold", or why it is unmeasured
    classes: tuple[str, ...] = ()  # the gold classes it was measured on
    unmeasured: tuple[str, ...] = ()  # chosen categories no gold class covers (phones, e-mails...)

    def describe(self) -> str:
        if self.how == "gold only":
            return "the protected entities are exactly the corpus' gold tags"
        if self.value is None:
            return f"detector recall unmeasured ({self.how})"
        rest = f"; unmeasured for {', '.join(self.unmeasured)} (no gold class)" if self.unmeasured else ""
        return (f"detector recall {self.value:.3f} (overlap recall of the chosen categories' detections on held-out "
                f"gold {', '.join(self.classes)} tags{rest})")


def detector_recall(catalog: Catalog, categories: list[str]) -> DetectorRecall:
    """Overlap recall, on held-out gold spans of the chosen categories' CoNLL classes, of the automatic
    detectors' spans *of the chosen categories* (their union: what a run protects besides the gold tags,
    which are protected too). An estimate for text without gold tags, measured where gold exists."""
    coarse = taxonomy().coarse
    classes = tuple(sorted({str(coarse[c]) for c in categories if coarse.get(c)}))
    unmeasured = tuple(c for c in categories if not coarse.get(c))
    detectors = catalog.detectors() if "entities" in catalog.tables else []
    automatic = [d for d in detectors if d != "gold"]
    if "gold" in detectors and not automatic:
        return DetectorRecall(None, "gold only")
    if "gold" not in detectors:
        return DetectorRecall(None, "no gold tags to measure it on: detect with --detector gold,... on a "
                                    "labelled sample", unmeasured=tuple(categories))
    rows = [row for row in catalog.coverage(automatic, coarse, splits=HELD_OUT, predicted_categories=categories)
            if row[0] in classes]
    total = sum(row[1] for row in rows)
    if not total:
        return DetectorRecall(None, "no held-out gold tags of the chosen categories", unmeasured=tuple(categories))
    found = sum(round(row[6] * row[1]) for row in rows)
    return DetectorRecall(found / total, "held-out gold", classes, unmeasured)
