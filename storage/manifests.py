"""The manifests of a dataset's tables, typed: what services ask of a table's ``manifest.json`` (its content
key, row count, where its text came from, how its entities were detected), read here and nowhere else.

A manifest is written by :class:`storage.tables.TableWriter` from the details its writer gives (ingest,
detect, sanitize, generate); older uedp versions wrote fewer fields, so every accessor has the value an
absent field meant. Services read them through these types (``tests/test_architecture.py`` refuses
``read_manifest`` outside storage), so the nested-dict spelling of a field lives in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uedp.storage.home import DataHome
from uedp.storage.schemas import GENERATED_FROM
from uedp.storage.tables import read_manifest
from uedp.storage.text_identity import TEXT_KEY


@dataclass(frozen=True)
class TableManifest:
    """A complete table's manifest: its content key, its rows, when it was written."""

    folder: Path
    record: Mapping[str, Any]

    @property
    def key(self) -> str:
        """The content key the table was built from (its inputs and settings): unchanged inputs, same key."""
        return str(self.record.get("key", ""))

    @property
    def rows(self) -> int:
        return int(self.record.get("rows") or 0)

    @property
    def created(self) -> str:
        return str(self.record.get("created", ""))

    def detail(self, name: str, default: Any = None) -> Any:
        """A detail its writer recorded that no shared accessor names (a release's figures, a note)."""
        return self.record.get(name, default)


@dataclass(frozen=True)
class SentencesManifest(TableManifest):
    """A dataset's sentences table: where its text came from."""

    @property
    def _source(self) -> Mapping[str, Any]:
        source = self.record.get("source")
        return source if isinstance(source, Mapping) else {}

    @property
    def source_format(self) -> str:
        """The corpus format it was ingested from ("" for a release or a generated corpus)."""
        options = self._source.get("options")
        return str(options.get("format", "")) if isinstance(options, Mapping) else ""

    @property
    def derived_from(self) -> str | None:
        """The dataset a local-DP release was drawn from, when this table is one."""
        dataset = self._source.get("dataset")
        return str(dataset) if dataset else None

    @property
    def source_text_key(self) -> str:
        """A release's source text key, recorded when it was drawn ("" for an older release or none)."""
        return str(self._source.get(TEXT_KEY) or "")

    @property
    def source_sentences_key(self) -> str:
        """A release's source sentences table's content key ("" when none was recorded)."""
        return str(self._source.get("sentences_key") or "")

    @property
    def generated_from(self) -> Mapping[str, Any] | None:
        """A synthetic corpus' record of the run that generated it (None for any other dataset)."""
        found = self.record.get(GENERATED_FROM)
        return found if isinstance(found, Mapping) else None

    @property
    def per_split(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in (self.record.get("per_split") or {}).items()}


@dataclass(frozen=True)
class EntitiesManifest(TableManifest):
    """A dataset's entities table: the sentences it was detected on, and how."""

    @property
    def sentences_key(self) -> str:
        """The content key of the sentences table it was detected on (stale when that table changed)."""
        return str(self.record.get("sentences_key") or "")

    @property
    def detector(self) -> Mapping[str, Any]:
        """The detector configuration (its names, spaCy pipeline, recognizers); empty when none was recorded."""
        found = self.record.get("detector")
        return found if isinstance(found, Mapping) else {}

    @property
    def detectors(self) -> tuple[str, ...]:
        return tuple(str(name) for name in self.detector.get("detectors", ()))

    @property
    def spacy_model(self) -> str:
        return str(self.detector.get("spacy_model") or "")

    @property
    def taxonomy_digest(self) -> str | None:
        found = self.record.get("taxonomy_digest")
        return str(found) if found is not None else None

    @property
    def entity_identity(self) -> Any:
        """The version of the entity keys it holds (``detection.identity.IDENTITY_VERSION``)."""
        return self.record.get("entity_identity")

    @property
    def note(self) -> str:
        return str(self.record.get("note") or "")

    @property
    def ignored_surfaces(self) -> int:
        return int(self.record.get("ignored_surfaces") or 0)


def table_manifest(folder: Path) -> TableManifest | None:
    """The manifest of the complete table in ``folder``, or None when there is none."""
    record = read_manifest(folder)
    return TableManifest(folder, record) if record is not None else None


def sentences_manifest(home: DataHome, dataset: str) -> SentencesManifest | None:
    """The dataset's sentences manifest, or None when it is not ingested (here)."""
    return sentences_manifest_in(home.table_dir(dataset, "sentences"))


def sentences_manifest_in(folder: Path) -> SentencesManifest | None:
    record = read_manifest(folder)
    return SentencesManifest(folder, record) if record is not None else None


def entities_manifest(home: DataHome, dataset: str) -> EntitiesManifest | None:
    """The dataset's entities manifest, or None when it was not detected (here)."""
    return entities_manifest_in(home.table_dir(dataset, "entities"))


def entities_manifest_in(folder: Path) -> EntitiesManifest | None:
    record = read_manifest(folder)
    return EntitiesManifest(folder, record) if record is not None else None
