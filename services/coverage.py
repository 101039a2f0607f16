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
from pathlib import Path
from typing import Any

from uedp.detection import detectors as detector_registry
from uedp.detection.categories import taxonomy
from uedp.services.lineage import protected_ids
from uedp.storage.catalog import Catalog
from uedp.storage.home import DataHome
from uedp.storage.manifests import EntitiesManifest, entities_manifest, entities_manifest_in

COVERAGE_FILE = "coverage.json"
HELD_OUT = ("valid", "test")
ANY = "any automatic detector"  # the union of several: a gold span found by any of them is covered
FIELDS = ("class", "gold", "predicted", "exact", "precision", "recall", "overlap_recall")


SPLITS = ("train", "valid", "test")
# Scopes of the stored figures: all splits together, held-out (valid and test), and each split alone.
SCOPES: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("all", None), ("held_out", HELD_OUT), *((split, (split,)) for split in SPLITS))


def compute_coverage(catalog: Catalog) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per scope (``all`` splits, ``held_out``: valid and test, and each of ``train``, ``valid`` and
    ``test``), per automatic detector, a row per CoNLL class (precision, recall, overlap recall against
    gold); with several detectors, also their union as :data:`ANY`. Empty when there is no gold to
    compare with."""
    detectors = catalog.detectors()
    if "gold" not in detectors:
        return {}
    coarse = taxonomy().coarse
    automatic = [name for name in detectors if name != "gold"]
    groups = {name: [name] for name in automatic} | ({ANY: automatic} if len(automatic) > 1 else {})
    return {scope: {name: [dict(zip(FIELDS, row)) for row in catalog.coverage(group, coarse, splits=splits)]
                    for name, group in groups.items()}
            for scope, splits in SCOPES}


def store_coverage(home: DataHome, dataset: str) -> None:
    """Write ``coverage.json`` beside a freshly written entities table (atomically)."""
    folder = home.table_dir(dataset, "entities")
    manifest = entities_manifest_in(folder)
    if manifest is None:
        return
    with Catalog(home, dataset) as catalog:
        figures = compute_coverage(catalog)
    partial = folder / f".{COVERAGE_FILE}.{uuid.uuid4().hex[:8]}.tmp"  # concurrent writers never share one
    try:
        partial.write_text(json.dumps({"entities_key": manifest.key, "coverage": figures}), encoding="utf-8")
        os.replace(partial, folder / COVERAGE_FILE)
    except OSError:  # a read-only data home: the figures are recomputed when asked for
        partial.unlink(missing_ok=True)


def stored_coverage(home: DataHome, dataset: str) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """The stored figures of the current entities table (computed and stored when missing or stale)."""
    folder = home.table_dir(dataset, "entities")
    manifest = entities_manifest_in(folder)
    path = folder / COVERAGE_FILE
    if manifest is not None and path.is_file():
        raw = json.loads(path.read_text(encoding="utf-8"))
        complete = not raw["coverage"] or all(scope in raw["coverage"] for scope, _ in SCOPES)  # older: no splits
        if raw.get("entities_key") == manifest.key and complete:
            return dict(raw["coverage"])
    store_coverage(home, dataset)
    return dict(json.loads(path.read_text(encoding="utf-8"))["coverage"]) if path.is_file() else {}


# What `uedp ner train` writes into its pipeline's meta.json (detection/ner_training.py), and the split it
# trains on (services/ner.py): figures of its detections on that split are not held-out.
NER_TRAINED_BY = "uedp ner train"
NER_TRAIN_SPLIT = "train"


@dataclass(frozen=True)
class SplitCoverage:
    """One detector's figures for one CoNLL class on one split (or on the held-out splits together)."""

    detector: str
    split: str  # "train", "valid", "test", or "valid+test" (held-out: what an epsilon's recall is measured on)
    own_training_split: bool  # the split the detector's NER (trained by `uedp ner train`) learnt from
    cls: str
    gold: int
    predicted: int
    exact: int
    precision: float
    recall: float
    overlap_recall: float

    @property
    def split_label(self) -> str:
        if self.own_training_split:
            return f"{self.split} (NER's training split)"
        return f"{self.split} (held-out)" if self.split in (*HELD_OUT, "+".join(HELD_OUT)) else self.split


def ner_trained_on(manifest: EntitiesManifest | None, ids: frozenset[str] = frozenset()) -> str | None:
    """The split of this dataset (its lineage ids, ``services.lineage.protected_ids``: a copy of its text under
    another name or split counts) that the entities table's spaCy pipeline was trained on, when `uedp ner train`
    made it (its meta.json says so), else None. A pipeline trained on another dataset's text has no split here.
    One from an older uedp, which did not record its dataset, marks the train split of any dataset: erring on
    the side of not calling its figures held-out."""
    model = manifest.spacy_model if manifest is not None else ""
    meta_file = Path(model) / "meta.json" if model else None
    if meta_file is None or not meta_file.is_file():
        return None
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if NER_TRAINED_BY not in str(meta.get("description", "")):
        return None
    recorded = meta.get("uedp_trained_on")
    if isinstance(recorded, dict) and recorded.get("dataset_id"):
        mine = ids.intersection([recorded["dataset_id"], *(recorded.get("text_lineage") or ())])
        return str(recorded.get("split") or NER_TRAIN_SPLIT) if mine else None
    return NER_TRAIN_SPLIT


def _own_split(home: DataHome, dataset: str) -> str | None:
    """The split of ``dataset`` the entities table's own `uedp ner train` NER learnt from, if any."""
    return ner_trained_on(entities_manifest(home, dataset), protected_ids(home, dataset))


def coverage_by_split(home: DataHome, dataset: str) -> list[SplitCoverage]:
    """The stored figures per detector, split and class (each split alone, then valid and test together),
    each marked when it is measured on the split the detector's own NER was trained on."""
    figures = stored_coverage(home, dataset)
    trained_on = _own_split(home, dataset)
    parsing = {name for name, spec in detector_registry.detectors().items() if spec.needs_nlp} | {ANY}
    rows = []
    for scope, label in (*((split, split) for split in SPLITS), ("held_out", "+".join(HELD_OUT))):
        for name, per_class in figures.get(scope, {}).items():
            own = trained_on is not None and name in parsing and (
                scope == trained_on or (scope == "held_out" and trained_on in HELD_OUT))
            rows += [SplitCoverage(name, label, own, *(row[f] for f in FIELDS)) for row in per_class]
    order = {name: i for i, name in enumerate(dict.fromkeys(row.detector for row in rows))}
    return sorted(rows, key=lambda row: order[row.detector])  # stable: per detector, splits in order


@dataclass(frozen=True)
class DetectorRecall:
    """The recall an entity-level epsilon's coverage rests on, and how it was obtained."""

    value: float | None  # None: not measured (or nothing to measure: gold tags only)
    how: str  # "gold only", "held-out gold", or why it is unmeasured
    classes: tuple[str, ...] = ()  # the gold classes it was measured on
    unmeasured: tuple[str, ...] = ()  # chosen categories no gold class covers (phones, e-mails...)
    ignored_surfaces: int = 0  # surfaces the curator's --ignore-entities list dropped from detection

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
    which are protected too). An estimate for text without gold tags, measured where gold exists, and never
    on a held-out split the detectors' own NER learnt from (`uedp ner train --train-split valid`: test only)."""
    coarse = taxonomy().coarse
    classes = tuple(sorted({str(coarse[c]) for c in categories if coarse.get(c)}))
    unmeasured = tuple(c for c in categories if not coarse.get(c))
    detectors = catalog.detectors() if "entities" in catalog.tables else []
    automatic = [d for d in detectors if d != "gold"]
    # A count of the curator's list (never its surfaces, which are private text): released in the caveats.
    detected = catalog.entities_manifest()
    ignored = detected.ignored_surfaces if detected is not None else 0
    if "gold" in detectors and not automatic:
        return DetectorRecall(None, "gold only", ignored_surfaces=ignored)
    if "gold" not in detectors:
        return DetectorRecall(None, "no gold tags to measure it on: detect with --detector gold,... on a "
                                    "labelled sample", unmeasured=tuple(categories), ignored_surfaces=ignored)
    own = _own_split(catalog.home, catalog.dataset)
    held_out = tuple(split for split in HELD_OUT if split != own)
    rows = [row for row in catalog.coverage(automatic, coarse, splits=held_out, predicted_categories=categories)
            if row[0] in classes]
    total = sum(row[1] for row in rows)
    if not total:
        return DetectorRecall(None, "no held-out gold tags of the chosen categories", unmeasured=tuple(categories),
                              ignored_surfaces=ignored)
    found = sum(round(row[6] * row[1]) for row in rows)
    return DetectorRecall(found / total, "held-out gold", classes, unmeasured, ignored)
