"""``uedp ner train``: a spaCy NER from an ingested dataset's gold entity tags (CoNLL-2003 here), trained
on CPU with no download, saved as a pipeline folder for ``--spacy-model``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from uedp.detection.categories import taxonomy
from uedp.detection.ner_training import EpochReport, GoldSentence, NerTrainingResult, check_output, train_ner
from uedp.errors import UedpError
from uedp.storage.formats.registry import formats
from uedp.storage.home import DataHome
from uedp.storage.tables import DATA_FILE, read_manifest


def gold_sentences(home: DataHome, dataset: str, split: str) -> list[GoldSentence]:
    """The split's sentences with their gold spans, labels in the taxonomy's canonical names (PER is PERSON)."""
    folder = home.table_dir(dataset, "sentences")
    manifest = read_manifest(folder)
    if manifest is None:
        raise UedpError(f"dataset {dataset!r} has no sentences table under {home.dataset_dir(dataset)}; ingest it first")
    source_format = str(manifest.get("source", {}).get("options", {}).get("format", ""))
    gold_formats = sorted(name for name, f in formats().items() if f.gold)  # read now: formats may register late
    if source_format and source_format not in gold_formats:
        raise UedpError(f"dataset {dataset!r} was ingested from {source_format} files, which carry no gold entity "
                        f"tags to train on (only {', '.join(gold_formats)} does)")
    tax = taxonomy(home.labels_file)
    table = pq.read_table(folder / DATA_FILE, columns=["split", "text", "gold_spans"], filters=[("split", "=", split)])
    out: list[GoldSentence] = []
    for text, spans in zip(table.column("text").to_pylist(), table.column("gold_spans").to_pylist()):
        labelled = []
        for span in spans or []:
            label = tax.canonical_of(str(span["label"]))
            if label is None:
                raise UedpError(f"dataset {dataset!r}: gold label {span['label']!r} is not in the taxonomy {tax.source}; "
                                f"{tax.how_to_add(str(span['label']))}")
            labelled.append((int(span["start"]), int(span["end"]), label))
        out.append((text, labelled))
    return out


def default_output(home: DataHome, dataset: str) -> Path:
    return home.root / "models" / f"ner-{dataset}"


def train_dataset_ner(home: DataHome, dataset: str, out: Path | None = None, *, epochs: int = 15,
                      max_minutes: float | None = 10.0, train_split: str = "train", dev_split: str = "valid",
                      eval_split: str = "test", seed: int = 0,
                      on_epoch: Callable[[EpochReport], None] = lambda r: None) -> NerTrainingResult:
    target = out or default_output(home, dataset)
    try:
        check_output(target)  # before minutes of training, not after
    except ValueError as exc:
        raise UedpError(str(exc)) from None
    train = gold_sentences(home, dataset, train_split)
    if not any(spans for _, spans in train):
        raise UedpError(f"dataset {dataset!r} has no gold entity tags in its {train_split} split to train on")
    held_out = gold_sentences(home, dataset, eval_split)
    if not held_out:
        raise UedpError(f"dataset {dataset!r} has no {eval_split} sentences to score the NER on")
    dev = gold_sentences(home, dataset, dev_split) if dev_split else []
    sentences_key = str((read_manifest(home.table_dir(dataset, "sentences")) or {}).get("key", ""))
    return train_ner(train, held_out, target, dev=dev, epochs=epochs,
                     max_seconds=max_minutes * 60 if max_minutes else None, seed=seed, on_epoch=on_epoch,
                     trained_on={"dataset_id": home.keyed_id(sentences_key), "split": train_split})
