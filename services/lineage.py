"""Lineage: which private texts a model's weights have seen, keyed by content, wherever the model turns up.

A run's epsilon covers what its training does with its dataset; the weights it starts from are treated as
public (docs/PRIVACY.md, "The starting model"). Weights trained, at any remove, on the text a run protects
would carry that text into the model outside epsilon, so such a start is refused, however it is named:

* **by content, not by name.** A dataset's texts are the keyed ids of its sentences' *text key*
  (:mod:`storage.text_identity`: blind to its name, its split and its users) and, for a local-DP release,
  of the text it was drawn from: a release that copies words verbatim (``--keep non-entities``) is no
  public text for the dataset it came from;
* **the model carries its lineage.** Every model a run logs holds a marker (``init_run.json``: the run, its
  dataset and every text its weights saw), and the data home keeps the same record under the content hash
  of the model's files, so a copy of the folder is known as that run's model whether it comes back through
  ``--init-from RUN``, ``--init-from FOLDER``, ``--model FOLDER`` or ``--model-config FOLDER``, and
  whether or not the marker was kept. A run started from it inherits its lineage.

* **by sentence, not only by the whole text.** A copy of the train split alone, of part of it, or of a
  superset of it is another text id; it still counts as this dataset's text when it shares at least a few of
  the train split's distinctive sentences word for word (:mod:`services.text_overlap`).

What no check here sees: a copy whose sentences differ (lower-cased, edited), one or two copied sentences,
a model trained in another data home (its keyed ids use another secret) or changed outside uedp
(fine-tuned, or saved again with other bytes), and a checkpoint uedp did not train.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uedp.errors import UedpError
from uedp.models.checkpoints import INIT_RUN_FILE, vocabulary_file_hashes
from uedp.services.text_overlap import shares_train_text
from uedp.storage.home import DataHome
from uedp.storage.manifests import sentences_manifest, sentences_manifest_in, table_manifest
from uedp.storage.text_identity import table_text_key

# MLflow tags of a run: the texts its own dataset is (and was drawn from), and what its start had seen.
TEXT_LINEAGE_TAG = "uedp.text_lineage"
START_LINEAGE_TAG = "uedp.initial_lineage"
DATASET_ID_TAG = "uedp.dataset_id"  # the keyed content id of the dataset's sentences table (ingest options included)
ENTITIES_ID_TAG = "uedp.entities_id"  # the keyed content id of the dataset's entities table (its detections)
# The keyed content id of the model files a run started from ("none": random weights); keyed, as the tables'
# ids are, so that it says only whether two runs started from the same files.
START_ID_TAG = "uedp.start_id"


def keyed_table_id(home: DataHome, dataset: str, table: str) -> str:
    """A table's content key, keyed with the data home's secret: released as-is, a content key hashes the
    corpus itself and would let anyone who can guess D or D' tell them apart."""
    manifest = table_manifest(home.table_dir(dataset, table))
    return home.keyed_id(manifest.key if manifest is not None else "")


def start_id(home: DataHome, content_hash: str) -> str:
    """The keyed id of a start's model files (``START_ID_TAG``); "none" for random weights."""
    return home.keyed_id(content_hash) if content_hash else "none"


def text_lineage(home: DataHome, dataset: str) -> tuple[str, ...]:
    """The keyed ids of the texts a dataset's sentences are: its own text and, for a local-DP release, the
    text it was drawn from (and that text's own sources); for a synthetic dataset, the texts of the run whose
    model it was sampled from (a model trained on it carries them: another release of those texts). That
    run's start is not among them: the run treated it as public (:func:`run_lineage` still carries it)."""
    keys: list[str] = []
    sampled_from: list[str] = []  # a synthetic dataset's: the keyed ids its model's lineage recorded
    seen: set[str] = set()
    name: str | None = dataset
    while name is not None and name not in seen:
        seen.add(name)
        sentences = home.table_dir(name, "sentences")
        keys.append(table_text_key(sentences))
        manifest = sentences_manifest_in(sentences)
        generated = manifest.generated_from if manifest is not None else None
        if generated is not None:  # sampled from a model: it carries the texts that model's run protects
            sampled_from += [str(i) for i in generated.get("lineage", ()) if i]
        name = manifest.derived_from if manifest is not None else None
        if name is not None and manifest is not None:
            # recorded when the release was drawn; an older release's: its source as it is now
            keys.append(manifest.source_text_key)
    keyed = home.keyed_ids([f"text:{k}" if k else "" for k in keys])
    return tuple(dict.fromkeys(i for i in (*keyed, *sampled_from) if i))


def protected_ids(home: DataHome, dataset: str) -> frozenset[str]:
    """Every id under which a model's lineage may name this dataset's text: its texts, and the keyed
    content id of its sentences table, which runs of an older uedp recorded instead."""
    return frozenset(text_lineage(home, dataset)) | {keyed_table_id(home, dataset, "sentences")} - {""}


@dataclass(frozen=True)
class RunMarker:
    """What a logged model says of itself: the run that trained it and every text its weights saw."""

    run_id: str
    dataset: str = ""
    mechanism: str = ""
    lineage: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "dataset": self.dataset, "mechanism": self.mechanism,
                "lineage": list(self.lineage)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunMarker:
        return cls(str(data.get("run_id", "")), str(data.get("dataset", "")), str(data.get("mechanism", "")),
                   tuple(str(i) for i in data.get("lineage", ()) if i))

    def merged(self, other: RunMarker | None) -> RunMarker:
        if other is None:
            return self
        return RunMarker(self.run_id or other.run_id, self.dataset or other.dataset, self.mechanism or other.mechanism,
                         tuple(dict.fromkeys((*self.lineage, *other.lineage))))

    def describe(self, public: bool = True) -> str:
        """The run in a privacy statement's words (``public``: saying its text is treated as public)."""
        what = f"{self.mechanism} on dataset {self.dataset!r}" if self.dataset else "its dataset"
        return f"run {self.run_id} ({what}{', whose text is treated as public' if public else ''})"


def run_lineage(home: DataHome, dataset: str, start_lineage: tuple[str, ...]) -> tuple[str, ...]:
    """The texts a run's weights will have seen: its dataset's and its start's, and for a synthetic dataset
    also those its generating model had started from (they shaped every sampled text)."""
    manifest = sentences_manifest(home, dataset)
    generated = manifest.generated_from if manifest is not None else None
    sampled_start = [str(i) for i in generated.get("start_lineage", ()) if i] if generated is not None else []
    return tuple(dict.fromkeys((*text_lineage(home, dataset), *sampled_start, *start_lineage)))


def marker_in(folder: Path) -> RunMarker | None:
    """The marker a folder holds, if any."""
    file = folder / INIT_RUN_FILE
    if not file.is_file():
        return None
    try:
        return RunMarker.from_json(json.loads(file.read_text(encoding="utf-8")))
    except (OSError, ValueError, AttributeError) as exc:
        raise UedpError(f"{file}: not a uedp run marker ({exc}); it says which run trained this model and which "
                        "texts it saw: restore it, or remove the folder") from None


def marker_of(home: DataHome, folder: Path, content_hash: str) -> RunMarker | None:
    """Which run made the model in ``folder``: its own marker, or this data home's record of a model with
    the same files (a copy whose marker was lost). None: a checkpoint no run of this home logged."""
    recorded = _recorded(home, content_hash)
    own = marker_in(folder)
    return own.merged(recorded) if own is not None else recorded


def _record_file(home: DataHome, content_hash: str) -> Path:
    return home.model_lineage_dir / f"{content_hash.removeprefix('sha256:').replace(':', '-')}.json"


def _recorded(home: DataHome, content_hash: str) -> RunMarker | None:
    file = _record_file(home, content_hash) if content_hash else None
    if file is None or not file.is_file():
        return None
    try:
        return RunMarker.from_json(json.loads(file.read_text(encoding="utf-8")))
    except (OSError, ValueError, AttributeError) as exc:
        raise UedpError(f"{file}: not a uedp lineage record ({exc}); it says which texts a logged model's files "
                        "carry: restore it from a backup rather than deleting it") from None


def mark_logged_model(home: DataHome, folder: Path, marker: RunMarker, content_hash: str,
                      tokenizer: RunMarker | None = None) -> None:
    """Before a model is logged: its marker into its folder, and this home's record of its files; and, for a
    tokenizer whose vocabulary was learnt from text (``tokenizer``: its lineage), a record under each of its
    vocabulary files, so a copy of those files alone is known as that vocabulary."""
    (folder / INIT_RUN_FILE).write_text(json.dumps(marker.as_json()), encoding="utf-8")
    _record(home, content_hash, marker)
    if tokenizer is not None and tokenizer.lineage:
        for digest in vocabulary_file_hashes(folder):
            _record(home, digest, tokenizer)


def _record(home: DataHome, content_hash: str, marker: RunMarker) -> None:
    """Add ``marker`` to the record of these files, under a lock: two runs logging the same files at once
    (the same vocabulary, say) must both stay in it."""
    record = _record_file(home, content_hash)
    record.parent.mkdir(parents=True, exist_ok=True)
    with open(record.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            merged = marker.merged(_recorded(home, content_hash))  # the same files from two runs: both lineages
            handle, temporary = tempfile.mkstemp(prefix=record.name, dir=record.parent)
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(merged.as_json(), out)
            os.replace(temporary, record)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def vocabulary_record(home: DataHome, folder: Path) -> RunMarker | None:
    """What this data home recorded of the vocabulary files in a folder: the text they were learnt from, as
    logged models that shipped them recorded it (:func:`mark_logged_model`). None: no record."""
    known = [m for m in (_recorded(home, d) for d in vocabulary_file_hashes(folder)) if m is not None]
    if not known:
        return None
    merged = known[0]
    for other in known[1:]:
        merged = merged.merged(other)
    return merged


def meets_text(home: DataHome, dataset: str, lineage: tuple[str, ...] | list[str], named_dataset: str = "") -> bool:
    """Whether texts of ``lineage`` (or the dataset named ``named_dataset``) are the text ``dataset`` protects:
    the same text under any name or split, a local-DP release of it, or a text that shares the sentences
    of its train split (a copy of the split, of part of it, or a superset: :mod:`services.text_overlap`)."""
    return (named_dataset == dataset or bool(protected_ids(home, dataset) & set(lineage))
            or shares_train_text(home, dataset, lineage))


def refuse_same_text(home: DataHome, dataset: str, marker: RunMarker, named: str) -> None:
    """Refuse a start whose weights saw the text ``dataset`` holds (``named``: how the user named it)."""
    if not meets_text(home, dataset, marker.lineage, marker.dataset):
        return
    raise UedpError(f"{named}: that model's weights were trained on the text this run protects ({dataset!r}): "
                    f"{marker.describe(public=False)} trained on it, or on a copy "
                    "of it (or of part of its train split) under another name or split, or on a local-DP release "
                    "of it, or started from a model that did. It would carry that text outside epsilon. Start from "
                    "a model trained on public text")
