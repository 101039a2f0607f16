"""Arrow schemas of the project's tables (ARCHITECTURE.md, "Data model"). Bump SCHEMA_VERSION on change."""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 2

SPAN = pa.struct([("start", pa.int32()), ("end", pa.int32()), ("label", pa.string())])

SENTENCES = pa.schema(
    [
        ("sentence_id", pa.int64()),
        ("user_id", pa.string()),
        ("doc_id", pa.string()),
        ("split", pa.string()),
        ("position", pa.int32()),
        ("text", pa.string()),
        ("label", pa.string()),  # class of classification corpora (AG News); null elsewhere
        ("source_file", pa.string()),
        ("source_line", pa.int64()),
        ("gold_spans", pa.list_(SPAN)),
    ]
)

USERS = pa.schema(
    [
        ("user_id", pa.string()),
        ("n_sentences", pa.int64()),
        ("n_train", pa.int64()),
        ("n_valid", pa.int64()),
        ("n_test", pa.int64()),
    ]
)

ENTITIES = pa.schema(
    [
        ("sentence_id", pa.int64()),
        ("user_id", pa.string()),
        ("start", pa.int32()),
        ("end", pa.int32()),
        ("category", pa.string()),
        ("detector", pa.string()),
        ("score", pa.float32()),
        ("entity_key", pa.string()),
        ("text", pa.string()),
    ]
)

# Per-document metadata a format carries (Reuters-21578's TOPICS, PLACES, PEOPLE, ORGS, DATE), in long form
# (one row per value): a side file of the sentences table, ``documents.parquet``, joined on doc_id.
DOCUMENT_TAGS = pa.schema([("doc_id", pa.string()), ("tag", pa.string()), ("value", pa.string())])
DOCUMENT_TAGS_FILE = "documents.parquet"

SPLITS = ("train", "valid", "test")

# The manifest field of a synthetic dataset's tables (``uedp generate``): the run it was sampled from, that
# run's privacy statement and the keyed ids of every text its model saw (services.synthetic_source).
GENERATED_FROM = "generated_from"
