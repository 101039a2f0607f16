"""The ``gold`` detector: entity spans from the corpus' own annotation (CoNLL NER tags)."""

from __future__ import annotations

import re
from typing import Iterable, Iterator

import pyarrow as pa

_SPACE = re.compile(r"\s+")


def normalize_surface(text: str) -> str:
    """Surface form used for entity identity: case-folded, whitespace collapsed."""
    return _SPACE.sub(" ", text).strip().casefold()


def entity_key(category: str, text: str) -> str:
    """One entity across users and sentences: category plus normalized surface form."""
    return f"{category}:{normalize_surface(text)}"


def gold_entities(batches: Iterable[pa.RecordBatch]) -> Iterator[list[dict[str, object]]]:
    """Yield entity rows, one list per input batch of sentences (columns sentence_id, user_id, text, gold_spans)."""
    for batch in batches:
        rows: list[dict[str, object]] = []
        for sentence_id, user_id, text, spans in zip(
            batch.column("sentence_id").to_pylist(),
            batch.column("user_id").to_pylist(),
            batch.column("text").to_pylist(),
            batch.column("gold_spans").to_pylist(),
        ):
            for span in spans or []:
                surface = text[span["start"] : span["end"]]
                rows.append(
                    {
                        "sentence_id": sentence_id,
                        "user_id": user_id,
                        "start": span["start"],
                        "end": span["end"],
                        "category": span["label"],
                        "detector": "gold",
                        "score": 1.0,
                        "entity_key": entity_key(span["label"], surface),
                        "text": surface,
                    }
                )
        yield rows
