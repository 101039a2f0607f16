"""Entity identity: one entity, one privacy unit, whatever category a detector gave it. The ``gold``
detector itself (spans from the corpus' annotation) runs in :mod:`detection.pipeline` next to the
automatic detectors."""

from __future__ import annotations

import re

_SPACE = re.compile(r"\s+")
# Version of the key below; part of the entities table's content key, so tables built with another
# definition are detected again instead of being reused (version 1 prefixed the category).
IDENTITY_VERSION = 2


def normalize_surface(text: str) -> str:
    """Surface form used for entity identity: case-folded, whitespace collapsed."""
    return _SPACE.sub(" ", text).strip().casefold()


def entity_key(text: str) -> str:
    """One entity across users, sentences, detectors and categories: its normalized surface form.

    "Leeds" found as GPE by spaCy and as LOC by Presidio or the gold tags is one unit; the chosen
    categories still decide which detections make a sentence hold it. Homonyms ("Jordan" the person and
    the country) merge into one unit, which protects both together."""
    return normalize_surface(text)
