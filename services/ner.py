"""``uedp ner train``: a spaCy NER from an ingested dataset's gold entity tags (CoNLL-2003 here), trained
on CPU with no download, saved as a pipeline folder for ``--spacy-model``; and the check that keeps such a
NER from deciding what is private in the text it was fitted to.

Every entity- and token-level guarantee argues as if the spans detected in one sentence were a function of
that sentence (and of public things). A NER fitted without noise to a training split makes each sentence's
spans depend on every other sentence it learnt from: adding one user who tags "Northgate" as a person
changed the spans of 33 other users' sentences. So a pipeline ``uedp ner train`` fitted records the texts it
learnt from (their keyed lineage ids), its split, and the keyed hashes of its sentences with their writers;
detecting a dataset of the same text (a copy under another name or split, a release drawn from it included)
is refused when the NER learnt from that text's train split, or from a sentence a user of this dataset's
train split wrote. A NER fitted to another corpus, or to this one's held-out split, detects as usual.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from uedp.detection.categories import taxonomy
from uedp.detection.ner_training import EpochReport, GoldSentence, NerTrainingResult, check_output, train_ner
from uedp.errors import UedpError
from uedp.services.coverage import NER_TRAINED_BY
from uedp.services.lineage import protected_ids, text_lineage
from uedp.services.text_overlap import distinctive, sentence_ids, shares_sentences, train_index
from uedp.storage.catalog import Catalog
from uedp.storage.formats.registry import formats
from uedp.storage.home import DataHome
from uedp.storage.manifests import sentences_manifest, sentences_manifest_in
from uedp.storage.tables import DATA_FILE


def gold_sentences(home: DataHome, dataset: str, split: str) -> list[GoldSentence]:
    """The split's sentences with their gold spans, labels in the taxonomy's canonical names (PER is PERSON)."""
    folder = home.table_dir(dataset, "sentences")
    manifest = sentences_manifest_in(folder)
    if manifest is None:
        raise UedpError(f"dataset {dataset!r} has no sentences table under {home.dataset_dir(dataset)}; ingest it first")
    source_format = manifest.source_format
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
    return home.ner_model_dir(dataset)


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
    ingested = sentences_manifest(home, dataset)
    sentences_key = ingested.key if ingested is not None else ""
    trained_on = {"dataset_id": home.keyed_id(sentences_key), "split": train_split,
                  "text_lineage": list(text_lineage(home, dataset))}
    records = _records(home, dataset, train_split)
    learnt = "\n".join(sorted(set(_record_ids(home, records)))) + "\n"
    learnt_text = "\n".join(sorted(sentence_ids(home, (text for _, text in records)))) + "\n"
    return train_ner(train, held_out, target, dev=dev, epochs=epochs,
                     max_seconds=max_minutes * 60 if max_minutes else None, seed=seed, on_epoch=on_epoch,
                     trained_on=trained_on, side_files={LEARNT_SENTENCES_FILE: learnt, LEARNT_TEXT_FILE: learnt_text})


# In a pipeline folder `uedp ner train` wrote: one keyed hash a line, of each sentence it learnt from. Keyed
# with the data home's secret, so the folder tells nobody else which sentences those were.
LEARNT_SENTENCES_FILE = "uedp_learnt_sentences.txt"
# ... and of the text alone of each distinctive sentence (services.text_overlap), whoever wrote it: a dataset
# that holds the same sentences under other writers' names (another ingest, a superset) is still known.
LEARNT_TEXT_FILE = "uedp_learnt_text.txt"


def _records(home: DataHome, dataset: str, split: str) -> list[tuple[str, str]]:
    """A split's sentences as (user, text): a record, where the text alone would confuse two users' "Thanks."."""
    with Catalog(home, dataset) as catalog:
        return [(user, text) for _, user, text in catalog.sentences(split)]


def _record_ids(home: DataHome, records: list[tuple[str, str]]) -> list[str]:
    return home.keyed_ids([f"sentence:{user}\0{text}" for user, text in records])


def fitted_to_training_text(home: DataHome, dataset: str, spacy_model: str | None) -> str | None:
    """Why the pipeline ``spacy_model`` may not detect ``dataset``'s entities, or None: `uedp ner train` fitted
    it to this dataset's text (or a copy of it under another name or split, or a release drawn from it), to
    its train split, or to a held-out split that holds a sentence of a user in this dataset's train split
    now; or, whatever text it names, to sentences of this dataset's train split (a superset of the dataset,
    a copy of part of it: the same rule as a start's, :mod:`services.text_overlap`). A NER of another
    corpus detects, whatever common sentences ("Thank you.") the two texts share: its spans depend on that
    corpus, not on these users. A pipeline uedp did not train, or one trained in another data home, cannot
    be checked."""
    folder = Path(spacy_model).expanduser() if spacy_model else None
    meta = _uedp_meta(folder) if folder is not None else None
    if folder is None or meta is None:
        return None
    recorded = meta.get("uedp_trained_on") or {}
    same_text = protected_ids(home, dataset).intersection([*(recorded.get("text_lineage") or ()),
                                                            recorded.get("dataset_id")])
    learnt_file = folder / LEARNT_SENTENCES_FILE
    if same_text and (recorded.get("split", "train") == "train" or not learnt_file.is_file()):
        return f"it was fitted to the train split of the text of {dataset!r} (or of a copy or a release of it)"
    learnt = set(learnt_file.read_text(encoding="utf-8").split()) if learnt_file.is_file() else set()
    # Another text's "Thank you ." under a writer of the same name is no sign of this one's: its distinctive
    # sentences are (services.text_overlap).
    train = [(user, text) for user, text in _records(home, dataset, "train") if same_text or distinctive(text)]
    if learnt.intersection(_record_ids(home, train)):
        return f"it was fitted to sentences that users of the train split of {dataset!r} wrote"
    text_file = folder / LEARNT_TEXT_FILE
    if not same_text and text_file.is_file():  # this text's held-out split shares its templates, not its writers
        learnt_text = frozenset(text_file.read_text(encoding="utf-8").split())
        if shares_sentences(train_index(home, dataset), learnt_text):
            return (f"it was fitted to text that shares the sentences of the train split of {dataset!r} (a copy "
                    "of part of it, or a dataset that holds it)")
    return None


def _uedp_meta(folder: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and NER_TRAINED_BY in str(meta.get("description", "")) else None


def refuse_ner_fitted_to_training_text(home: DataHome, dataset: str, spacy_model: str | None, doing: str) -> None:
    """Refuse ``doing`` (detecting, or training on what was detected) with a NER fitted to the text it
    would decide the private spans of."""
    why = fitted_to_training_text(home, dataset, spacy_model)
    if why is None:
        return
    raise UedpError(f"{doing}: the spaCy pipeline {spacy_model} was trained by `uedp ner train` and {why}. The spans it "
                    "finds in one user's sentence would then depend on other users' text, which every entity- and "
                    "token-level guarantee assumes they do not (one added user changes what is private in the others' "
                    "sentences). Detect with a NER trained on another corpus (`uedp ner train OTHER`: CoNLL-2003 for "
                    "a chat corpus, say), or on this one's held-out text (`uedp ner train "
                    f"{dataset} --train-split valid`), or with --detector gold,presidio")
