"""DuckDB views over a dataset's Parquet tables and the named queries the pipeline runs on them.

Categories are parameters of these queries, never of detection: choosing other entity categories
costs one query.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from storage.home import DataHome
from storage.tables import DATA_FILE
from uedp.errors import UedpError

TABLES = ("sentences", "users", "entities")


@dataclass(frozen=True)
class CategoryCount:
    category: str
    entities: int
    sentences: int
    users: int


class Catalog:
    """An in-memory DuckDB connection with one view per existing table of ``dataset``."""

    def __init__(self, home: DataHome, dataset: str):
        self.dataset = dataset
        self.con = duckdb.connect(":memory:")
        self.tables: set[str] = set()
        for table in TABLES:
            path = home.table_dir(dataset, table) / DATA_FILE
            if path.is_file():
                # DDL cannot take prepared parameters: quote the path as an SQL string literal.
                literal = "'" + str(path).replace("'", "''") + "'"
                self.con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({literal})")
                self.tables.add(table)
        if "sentences" not in self.tables:
            raise UedpError(f"dataset {dataset!r} has no sentences table under {home.dataset_dir(dataset)}; ingest it first")

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> "Catalog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_entities(self) -> None:
        if "entities" not in self.tables:
            raise UedpError(f"dataset {self.dataset!r} has no entities table; run detection first")

    def sentences(self, split: str) -> list[tuple[int, str, str]]:
        """``(sentence_id, user_id, text)`` of a split, in corpus order."""
        return self.con.execute(
            "SELECT sentence_id, user_id, text FROM sentences WHERE split = ? ORDER BY sentence_id", [split]
        ).fetchall()

    def entity_spans(self, categories: list[str], split: str) -> dict[int, list[tuple[int, int, str, str]]]:
        """``sentence_id -> [(start, end, category, entity_key)]`` for the chosen categories in a split."""
        self._require_entities()
        rows = self.con.execute(
            """
            SELECT e.sentence_id, e.start, e."end", e.category, e.entity_key
            FROM entities e JOIN sentences s USING (sentence_id)
            WHERE s.split = ? AND list_contains(?, e.category)
            ORDER BY e.sentence_id, e.start
            """,
            [split, categories],
        ).fetchall()
        spans: dict[int, list[tuple[int, int, str, str]]] = {}
        for sentence_id, start, end, category, key in rows:
            spans.setdefault(sentence_id, []).append((start, end, category, key))
        return spans

    def category_counts(self, categories: list[str]) -> list[CategoryCount]:
        """Per category: distinct entities, sensitive sentences and users covered (UeDP paper, Table II)."""
        self._require_entities()
        rows = self.con.execute(
            """
            SELECT category, count(DISTINCT entity_key), count(DISTINCT sentence_id), count(DISTINCT user_id)
            FROM entities WHERE list_contains(?, category)
            GROUP BY category ORDER BY category
            """,
            [categories],
        ).fetchall()
        return [CategoryCount(*row) for row in rows]

    def count_users(self, split: str = "train") -> int:
        return int(self.con.execute("SELECT count(*) FROM users WHERE n_" + _split_column(split) + " > 0").fetchone()[0])


def _split_column(split: str) -> str:
    if split not in ("train", "valid", "test"):
        raise UedpError(f"unknown split {split!r}; valid: train, valid, test")
    return split
