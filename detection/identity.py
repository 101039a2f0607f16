"""Entity identity. The ``gold`` detector itself (spans from the corpus' annotation) runs in
:mod:`detection.pipeline` next to the automatic detectors."""

from __future__ import annotations

import re

_SPACE = re.compile(r"\s+")


def normalize_surface(text: str) -> str:
    """Surface form used for entity identity: case-folded, whitespace collapsed."""
    return _SPACE.sub(" ", text).strip().casefold()


def entity_key(category: str, text: str) -> str:
    """One entity across users and sentences: category plus normalized surface form."""
    return f"{category}:{normalize_surface(text)}"
