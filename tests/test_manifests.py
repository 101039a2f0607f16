"""The typed manifests (storage/manifests.py): what services ask of a table's manifest.json, with the value an
absent field meant for a table an older uedp wrote, and one clear error naming a damaged manifest's file. The
tables come from the real writer (storage.tables.TableWriter) and from ingest, detection and a local-DP
release elsewhere in the suite; here each accessor is pinned on its own."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from uedp.errors import UedpError
from uedp.storage.home import DataHome
from uedp.storage.manifests import (
    EntitiesManifest,
    SentencesManifest,
    entities_manifest,
    sentences_manifest,
    table_manifest,
)
from uedp.storage.schemas import GENERATED_FROM
from uedp.storage.tables import DATA_FILE, MANIFEST_FILE, TableWriter, read_manifest
from uedp.storage.text_identity import TEXT_KEY


def written(folder: Path, details: dict[str, object]) -> Path:
    """A table written whole by the real writer, with ``details`` in its manifest."""
    batch = pa.record_batch({"text": ["a", "b"], "split": ["train", "test"]})
    with TableWriter(folder, batch.schema, key="k" * 16, details=details) as writer:
        writer.write_batch(batch)
    return folder


def test_a_written_tables_manifest_reads_back_typed(tmp_path: Path) -> None:
    folder = written(tmp_path / "t", {"note": "made here"})
    manifest = table_manifest(folder)
    assert manifest is not None and manifest.key == "k" * 16 and manifest.rows == 2 and manifest.created
    assert manifest.detail("note") == "made here" and manifest.detail("absent", 7) == 7


def test_a_sentences_manifest_says_where_its_text_came_from(tmp_path: Path) -> None:
    home = DataHome(tmp_path / "home")
    release = {"source": {"dataset": "conll", TEXT_KEY: "t" * 64, "sentences_key": "s" * 16,
                          "options": {"format": "conll2003"}}, "per_split": {"train": 2, "test": 1},
               GENERATED_FROM: {"run_id": "r" * 32}}
    written(home.table_dir("conll-custext", "sentences"), release)
    manifest = sentences_manifest(home, "conll-custext")
    assert isinstance(manifest, SentencesManifest)
    assert (manifest.derived_from, manifest.source_text_key, manifest.source_sentences_key) == (
        "conll", "t" * 64, "s" * 16)
    assert manifest.source_format == "conll2003" and manifest.per_split == {"train": 2, "test": 1}
    assert manifest.generated_from == {"run_id": "r" * 32}


def test_an_older_sentences_manifest_means_an_original_ingested_corpus(tmp_path: Path) -> None:
    home = DataHome(tmp_path / "home")
    written(home.table_dir("old", "sentences"), {"source": "files a.txt"})  # an older uedp: source as words
    manifest = sentences_manifest(home, "old")
    assert manifest is not None
    assert (manifest.derived_from, manifest.source_text_key, manifest.source_sentences_key, manifest.source_format,
            manifest.generated_from, manifest.per_split) == (None, "", "", "", None, {})
    assert sentences_manifest(home, "never-ingested") is None


def test_an_entities_manifest_says_how_it_was_detected(tmp_path: Path) -> None:
    home = DataHome(tmp_path / "home")
    written(home.table_dir("d", "entities"), {
        "sentences_key": "s" * 16, "detector": {"detectors": ["spacy", "presidio"], "spacy_model": "en_core_web_sm"},
        "taxonomy_digest": "x1", "entity_identity": 2, "note": "gold", "ignored_surfaces": 3})
    manifest = entities_manifest(home, "d")
    assert isinstance(manifest, EntitiesManifest)
    assert manifest.sentences_key == "s" * 16 and manifest.detectors == ("spacy", "presidio")
    assert (manifest.spacy_model, manifest.taxonomy_digest, manifest.entity_identity, manifest.note,
            manifest.ignored_surfaces) == ("en_core_web_sm", "x1", 2, "gold", 3)
    written(home.table_dir("older", "entities"), {})
    older = entities_manifest(home, "older")
    assert older is not None and (older.sentences_key, older.detectors, older.spacy_model, older.taxonomy_digest,
                                  older.note, older.ignored_surfaces) == ("", (), "", None, "", 0)


def test_a_table_without_its_data_file_is_no_table(tmp_path: Path) -> None:
    folder = written(tmp_path / "t", {})
    (folder / DATA_FILE).unlink()  # a half-written table: the writer renames the data in last
    assert read_manifest(folder) is None and table_manifest(folder) is None


@pytest.mark.parametrize("text, says", [('{"key": "k", "rows": ', "not a table manifest (Expecting value"),
                                        ('["a list"]', "a JSON list, not an object"),
                                        (b"\xff\xfe{}", "not a table manifest")])
def test_a_damaged_manifest_is_one_error_naming_its_file(tmp_path: Path, text: str | bytes, says: str) -> None:
    folder = written(tmp_path / "t", {})
    path = folder / MANIFEST_FILE
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(UedpError) as caught:
        table_manifest(folder)
    assert str(caught.value).startswith(f"{path}: ") and says in str(caught.value)
    assert json.loads('{"still": "fine"}')  # nothing else in json was patched
