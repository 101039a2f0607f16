"""What makes two datasets the same text, whatever they are called and however they were split.

A table's content key (``manifest["key"]``) hashes the input files *and the ingest options*: it decides
whether an ingest can be reused. It cannot say whether two datasets hold the same people's text, since
the same file ingested under another name with another ``--split-seed`` or ``--users`` gets another key.
Lineage and the privacy ledger need that second question answered, so each sentences table also records
its **text key**: a hash of the multiset of its sentences' text, blind to order, splits, users and names.
Two datasets with the same sentences have the same text key; one changed character gives another.

Text keys, like content keys, hash the corpus itself and are never released as they are: callers release
``DataHome.keyed_id`` of them (PRIVACY.md rule 2).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import pyarrow.parquet as pq

from uedp.storage.tables import DATA_FILE, read_manifest

TEXT_KEY = "text_key"  # the manifest field of a sentences table


def sentence_digest(text: str) -> bytes:
    """One sentence's share of a text key."""
    return hashlib.sha256(text.encode("utf-8")).digest()


def text_key(digests: Iterable[bytes]) -> str:
    """The text key of a multiset of sentences, from their :func:`sentence_digest` in any order."""
    combined = hashlib.sha256(b"uedp text key v1\0")
    for digest in sorted(digests):
        combined.update(digest)
    return combined.hexdigest()


def text_key_of(texts: Iterable[str]) -> str:
    return text_key(sentence_digest(text) for text in texts)


def table_text_key(sentences_dir: Path) -> str:
    """The text key of a sentences table: the one its manifest records, or (a table an older uedp wrote)
    computed from its rows. Empty when there is no table."""
    manifest = read_manifest(sentences_dir)
    if manifest is None:
        return ""
    if manifest.get(TEXT_KEY):
        return str(manifest[TEXT_KEY])
    return _computed(str(sentences_dir / DATA_FILE), str(manifest.get("key", "")), str(manifest.get("created", "")))


_COMPUTED: dict[tuple[str, str, str], str] = {}


def _computed(data_file: str, content_key: str, created: str) -> str:
    """Reading every row of an older table once per process (keyed by the table's identity, so a table
    written again is read again)."""
    identity = (data_file, content_key, created)
    if identity not in _COMPUTED:
        texts = pq.read_table(data_file, columns=["text"]).column("text").to_pylist()
        _COMPUTED[identity] = text_key_of(t or "" for t in texts)
    return _COMPUTED[identity]
