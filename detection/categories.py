"""Entity categories a user can choose for training. Categories are a query over the entities table,
so choosing other ones never re-runs detection.

This is the gold-tag vocabulary of the ingested corpora (CoNLL-2003's PER/LOC/ORG/MISC and the demo
corpus' PHONE/EMAIL); the spaCy/Presidio taxonomy extends it (issue 4).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator

from uedp.errors import UedpError

KNOWN_CATEGORIES: tuple[str, ...] = ("PER", "LOC", "ORG", "MISC", "PHONE", "EMAIL")


def parse_categories(raw: str | list[str], known: tuple[str, ...] = KNOWN_CATEGORIES) -> list[str]:
    """Parse ``"PER,LOC"`` (or a list) into a sorted, de-duplicated list; unknown names are an error."""
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    names = sorted({item.strip().upper() for item in items if item.strip()})
    if not names:
        raise UedpError(f"no entity categories given; choose from {','.join(known)}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UedpError(f"unknown entity categories {','.join(unknown)}; valid: {','.join(known)}")
    return names


# A pydantic field type: accepts "PER,LOC" or a list, validates and normalises with parse_categories.
Categories = Annotated[list[str], BeforeValidator(lambda raw: parse_categories(raw))]
