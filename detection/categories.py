"""Entity categories: one taxonomy over spaCy/OntoNotes, CoNLL-2003 and Presidio labels.

Detectors store canonical categories; users choose categories (canonical names, aliases such as
``PER``, or composites such as ``PII``) at query time, so choosing others never re-runs detection.
The taxonomy is a data file (``detection/categories.yaml``, or the file ``UEDP_CATEGORIES`` names).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator, Field

from uedp.errors import UedpError

DEFAULT_TAXONOMY = Path(__file__).with_name("categories.yaml")


@dataclass(frozen=True)
class Taxonomy:
    canonical: tuple[str, ...]
    alias_to_canonical: dict[str, str]
    coarse: dict[str, str | None]
    composites: dict[str, tuple[str, ...]]
    source: str

    def canonical_of(self, label: str) -> str | None:
        """The canonical category of a detector's label, or None when the taxonomy does not know it."""
        return self.alias_to_canonical.get(label.upper())

    def names(self) -> list[str]:
        return list(self.canonical) + sorted(self.composites)

    def resolve(self, raw: str | list[str]) -> list[str]:
        """``"PER,PII"`` (or a list) -> sorted canonical categories; unknown names list the valid ones."""
        items = raw.split(",") if isinstance(raw, str) else list(raw)
        wanted = [item.strip().upper() for item in items if item.strip()]
        if not wanted:
            raise UedpError(f"no entity categories given; choose from {','.join(self.names())}")
        resolved: set[str] = set()
        unknown = []
        for name in wanted:
            if name in self.composites:
                resolved.update(self.composites[name])
            elif name in self.alias_to_canonical:
                resolved.add(self.alias_to_canonical[name])
            else:
                unknown.append(name)
        if unknown:
            raise UedpError(f"unknown entity categories {','.join(unknown)}; valid: {','.join(self.names())}")
        return sorted(resolved)


def load_taxonomy(path: Path) -> Taxonomy:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        categories: dict[str, dict[str, Any]] = data["categories"]  # parsed YAML: values are untyped
        composites = {name.upper(): tuple(members) for name, members in (data.get("composites") or {}).items()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise UedpError(f"cannot read the category taxonomy {path}: {exc}") from None
    aliases: dict[str, str] = {}
    for name, spec in categories.items():
        for alias in [name, *(spec.get("aliases") or [])]:
            if aliases.setdefault(str(alias).upper(), name) != name:
                raise UedpError(f"{path}: label {alias!r} is an alias of both {aliases[str(alias).upper()]} and {name}")
    for name, members in composites.items():
        missing = [m for m in members if m not in categories]
        if missing or name in aliases:
            raise UedpError(f"{path}: composite {name} names unknown categories {missing} or shadows a category")
    coarse: dict[str, str | None] = {name: spec.get("coarse") for name, spec in categories.items()}
    return Taxonomy(tuple(categories), aliases, coarse, composites, str(path))


@lru_cache(maxsize=4)
def _cached(path: str) -> Taxonomy:
    return load_taxonomy(Path(path))


def taxonomy() -> Taxonomy:
    """The taxonomy in force: ``UEDP_CATEGORIES`` if set, else the packaged file."""
    return _cached(os.environ.get("UEDP_CATEGORIES") or str(DEFAULT_TAXONOMY))


def parse_categories(raw: str | list[str]) -> list[str]:
    return taxonomy().resolve(raw)


def _choices_schema(schema: dict[str, object]) -> None:
    """JSON schema of a categories field: the taxonomy's categories and composites as choices, so the
    Prefect UI renders a multi-select (read when the schema is generated, so UEDP_CATEGORIES applies)."""
    tax = taxonomy()
    schema["items"] = {"type": "string", "enum": [*tax.canonical, *tax.composites]}


# A pydantic field type: accepts "PERSON,LOC" or a list, validates and normalises with the taxonomy.
Categories = Annotated[list[str], BeforeValidator(lambda raw: parse_categories(raw)),
                       Field(json_schema_extra=_choices_schema)]

DEFAULT_CATEGORIES = ("PERSON", "LOC", "ORG", "PHONE_NUMBER", "EMAIL_ADDRESS")


def default_categories() -> list[str]:
    """The categories a configuration treats as sensitive unless told otherwise (defined once)."""
    return list(DEFAULT_CATEGORIES)
