"""Text that shares a dataset's training sentences, whatever it is called and whatever else it holds.

A text id (:mod:`services.lineage`) names one exact multiset of sentences: a copy of the private train split
alone, or of half its documents, or the text with one more document, is another id. Keyed ids of whole texts
therefore miss every such copy, though a model trained on it carries those writers' sentences outside
epsilon. So each text that enters a lineage also has a **sentence index** here: the keyed hashes of its
distinctive sentences (at least :data:`MIN_WORDS` words), kept in the data home under the text's id
(``<home>/lineage/texts/<id>.txt``), so it outlives the dataset it was read from.

A text **shares the train split** of a dataset when at least :data:`MIN_SHARED` of its distinctive sentences
are, word for word, sentences of that split, and they make at least :data:`MIN_SHARE` of the smaller of the
two (the split's distinctive sentences, or the other text's). So a copy of the split, of half its documents,
of a few of them (the copy is the smaller side), or a superset (the split is), is caught, while a genuinely
public corpus that shares a few boilerplate lines passes: Reuters-21578 and CoNLL-2003's train split share 7
sentences ("REUTER", "- - - -", "Year ended March 31", ...), none of five words or more; the two halves of the
bundled demo corpus, written from the same templates by other writers, share 38% of the smaller half's
distinctive sentences. What is not caught: a copy of one or two sentences, or of a small part of the split
inside a much larger text; sentences of fewer than five words; and any copy whose sentences differ
(lower-cased, edited, segmented by another format). docs/PRIVACY.md, "Lineage", states the rule.

Nothing here is released: indexes stay in the data home, keyed with its secret like every other id.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pyarrow.parquet as pq

from uedp.storage.home import DataHome
from uedp.storage.manifests import table_manifest
from uedp.storage.tables import DATA_FILE
from uedp.storage.text_identity import table_text_key

MIN_WORDS = 5  # a sentence shorter than this ("Reuter", "Thank you .", a dateline) says little of who wrote it
MIN_SHARED = 3  # distinctive sentences in common before two texts count as sharing writers' text
MIN_SHARE = 0.5  # ... and the part of the smaller side they make (a copy of half the documents: about 0.8)
_WORD = re.compile(r"\w+")

_INDEXES: dict[tuple[str, ...], frozenset[str]] = {}  # per process, by the table's identity and the split read


def distinctive(text: str) -> bool:
    """Whether a sentence is long enough that finding it in two corpora means they share its writer's text."""
    return len(_WORD.findall(text)) >= MIN_WORDS


def sentence_ids(home: DataHome, texts: Iterable[str]) -> frozenset[str]:
    """The keyed hashes of the distinctive sentences among ``texts`` (their text alone, not who wrote them)."""
    kept = sorted({t for t in texts if t and distinctive(t)})
    return frozenset(home.keyed_ids([f"sentence-text:{t}" for t in kept]))


def own_text_id(home: DataHome, dataset: str) -> str:
    """The keyed id of the text a dataset's sentences table holds ("" before it is ingested)."""
    key = table_text_key(home.table_dir(dataset, "sentences"))
    return home.keyed_id(f"text:{key}") if key else ""


def _read_index(home: DataHome, dataset: str, split: str | None) -> frozenset[str]:
    folder = home.table_dir(dataset, "sentences")
    manifest = table_manifest(folder)
    if manifest is None:
        return frozenset()
    identity = (str(folder), manifest.key, manifest.created, split or "*")
    if identity not in _INDEXES:
        filters = [("split", "=", split)] if split else None
        texts = pq.read_table(folder / DATA_FILE, columns=["text"], filters=filters).column("text").to_pylist()
        _INDEXES[identity] = sentence_ids(home, (t or "" for t in texts))
    return _INDEXES[identity]


def train_index(home: DataHome, dataset: str) -> frozenset[str]:
    """The distinctive sentences of the dataset's train split: what its runs protect."""
    return _read_index(home, dataset, "train")


def _index_file(home: DataHome, text_id: str) -> Path:
    return home.model_lineage_dir / "texts" / f"{text_id}.txt"


def remember(home: DataHome, dataset: str) -> None:
    """Keep the sentence index of the dataset's text under its text id, for as long as the data home lives:
    called wherever the text enters a lineage (a logged model, a search, a vocabulary), so a model or search
    is still recognised after the dataset is removed."""
    text_id = own_text_id(home, dataset)
    file = _index_file(home, text_id) if text_id else None
    if file is None or file.is_file():
        return
    lines = "".join(f"{i}\n" for i in sorted(_read_index(home, dataset, None)))  # read before anything is written
    file.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=file.name, dir=file.parent)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(lines)
    os.replace(temporary, file)


def text_index(home: DataHome, text_id: str) -> frozenset[str] | None:
    """The sentence index of a text id: the one kept in the data home, else read from a dataset of the home
    that holds that text; None when neither exists (a text this home never indexed)."""
    file = _index_file(home, text_id)
    if file.is_file():
        return frozenset(file.read_text(encoding="utf-8").split())
    for name in home.dataset_folders():
        if own_text_id(home, name) == text_id:
            return _read_index(home, name, None)
    return None


def shares_train_text(home: DataHome, dataset: str, text_ids: Iterable[str]) -> bool:
    """Whether any of ``text_ids`` holds at least :data:`MIN_SHARED` of the distinctive sentences of the
    dataset's train split (the same text under another id: a copy of the split, of part of it, or a
    superset)."""
    ids = [i for i in dict.fromkeys(text_ids) if i]
    if not ids:
        return False
    protected = train_index(home, dataset)
    own = own_text_id(home, dataset)
    for text_id in ids:
        if text_id == own:
            return True
        index = text_index(home, text_id)
        if index is not None and shares_sentences(protected, index):
            return True
    return False


def shares_sentences(protected: frozenset[str], other: frozenset[str]) -> bool:
    """The rule, for two sentence indexes: enough distinctive sentences in common, and a large enough part
    of the smaller index."""
    shared = len(protected & other)
    return shared >= MIN_SHARED and shared >= MIN_SHARE * min(len(protected), len(other))
