"""DuckDB views over a dataset's Parquet tables and the named queries the pipeline runs on them.

Categories are parameters of these queries, never of detection: choosing other entity categories
costs one query.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from uedp.errors import UedpError
from uedp.storage.home import DataHome
from uedp.storage.manifests import EntitiesManifest, entities_manifest_in
from uedp.storage.tables import DATA_FILE, read_manifest

TABLES = ("sentences", "users", "entities")


@dataclass(frozen=True)
class CategoryCount:
    category: str
    entities: int
    sentences: int
    users: int


@dataclass(frozen=True)
class CommonEntity:
    """One entity of a category (its most frequent surface) and the users holding it, of ``of_users``: for
    the curator's terminal only (entity text and exact counts of private data)."""

    category: str
    surface: str
    users: int
    of_users: int

    @property
    def share(self) -> float:
        return self.users / self.of_users if self.of_users else 0.0


def ingested_datasets(home: DataHome) -> list[str]:
    """The datasets of this home: folders with a complete sentences table (not what a killed ingest left)."""
    return [name for name in home.dataset_folders() if read_manifest(home.table_dir(name, "sentences")) is not None]


def require_ingested(home: DataHome, dataset: str) -> None:
    """A clear error, before any work starts, for a dataset that was never ingested into this home."""
    if read_manifest(home.table_dir(dataset, "sentences")) is None:
        known = ingested_datasets(home)
        raise UedpError(f"dataset {dataset!r} has no sentences table under {home.dataset_dir(dataset)}; ingest it "
                        f"first ({'datasets here: ' + ', '.join(known) if known else 'this data home has no datasets'})")


def require_tables(home: DataHome, dataset: str, store: str | None) -> None:
    """:func:`require_ingested`, unless a table store supplies the tables (each training or detection pulls them
    first, and says which is missing)."""
    if not store:
        require_ingested(home, dataset)


def stale_entities_reason(home: DataHome, dataset: str) -> str | None:
    """Why the dataset's entities table does not describe its current sentences, or None when it does
    (or there is none). Detection records the content key of the sentences it read; a re-ingest from
    other files changes that key, and the old entities would otherwise pass for the new text's."""
    entities = read_manifest(home.table_dir(dataset, "entities"))
    sentences = read_manifest(home.table_dir(dataset, "sentences"))
    if entities is None or sentences is None:
        return None
    if entities.get("sentences_key") == sentences.get("key"):
        return None
    # Named by when each table was written, never by content hashes (this message may reach MLflow).
    return (f"the entities table of {dataset!r} (detected {entities.get('created', 'by an older uedp')}) was built "
            f"from other sentences than the dataset now holds (ingested {sentences.get('created', '?')}): run "
            f"`uedp detect {dataset} ...` again")


class Catalog:
    """An in-memory DuckDB connection with one view per existing table of ``dataset``."""

    def __init__(self, home: DataHome, dataset: str):
        self.dataset = dataset
        self.home = home
        require_ingested(home, dataset)
        self.tables: set[str] = set()
        self.stale_entities = stale_entities_reason(home, dataset)
        self.con = duckdb.connect(":memory:")
        try:
            self._create_views(home)
        except BaseException:
            self.con.close()  # an unclosed connection outlives the error (and nanobind reports it at exit)
            raise

    def _create_views(self, home: DataHome) -> None:
        for table in TABLES:
            path = home.table_dir(self.dataset, table) / DATA_FILE
            if table == "entities" and self.stale_entities:
                continue  # built from an earlier ingest: never read as if it described these sentences
            if path.is_file():
                # DDL cannot take prepared parameters: quote the path as an SQL string literal.
                literal = "'" + str(path).replace("'", "''") + "'"
                self.con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({literal})")
                self.tables.add(table)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_entities(self) -> None:
        if self.stale_entities:
            raise UedpError(self.stale_entities)
        if "entities" not in self.tables:
            raise UedpError(f"dataset {self.dataset!r} has no entities table; run detection first")

    def sentences(self, split: str) -> list[tuple[int, str, str]]:
        """``(sentence_id, user_id, text)`` of a split, in corpus order."""
        return self.con.execute(
            "SELECT sentence_id, user_id, text FROM sentences WHERE split = ? ORDER BY sentence_id", [split]
        ).fetchall()

    def roster_size(self, split: str) -> int:
        """Writers on the users table with at least one sentence in ``split`` (the roster, not the text)."""
        column = {"train": "n_train", "valid": "n_valid", "test": "n_test"}[split]
        row = self.con.execute(f"SELECT count(*) FROM users WHERE {column} > 0").fetchone()
        assert row is not None  # an aggregate without GROUP BY always yields one row
        return int(row[0])

    def labels(self, split: str) -> dict[int, str]:
        """``sentence_id -> class`` of a classification corpus' split (sentences without a class left out)."""
        return dict(self.con.execute(
            "SELECT sentence_id, label FROM sentences WHERE split = ? AND label IS NOT NULL", [split]).fetchall())

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

    def entities_per_category(self) -> dict[str, int]:
        """Detected spans per category, whatever the categories chosen (what a dataset holds at all)."""
        self._require_entities()
        return dict(self.con.execute("SELECT category, count(*) FROM entities GROUP BY 1 ORDER BY 2 DESC").fetchall())

    def common_entities(self, limit: int | None = 10, min_users: int = 1) -> list[CommonEntity]:
        """Entities (a category and an entity key) held by the most users, most first, with their most
        frequent surface and the dataset's users (writers of at least one sentence); only those held by
        at least ``min_users``, at most ``limit`` (None: all)."""
        self._require_entities()
        rows = self.con.execute(
            """
            WITH held AS (SELECT category, entity_key, mode(text) AS surface, count(DISTINCT user_id) AS users
                          FROM entities GROUP BY category, entity_key)
            SELECT category, surface, users, (SELECT count(DISTINCT user_id) FROM sentences)
            FROM held WHERE users >= ? ORDER BY users DESC, category, entity_key LIMIT ?
            """,
            [min_users, limit],
        ).fetchall()
        return [CommonEntity(category, surface, users, of_users) for category, surface, users, of_users in rows]

    def entities_manifest(self) -> EntitiesManifest | None:
        """The entities table's manifest (how it was detected), or None when it has none or is stale."""
        if "entities" not in self.tables:
            return None
        return entities_manifest_in(self.home.table_dir(self.dataset, "entities"))

    def detectors(self) -> list[str]:
        """Names of the detectors whose spans the entities table holds."""
        self._require_entities()
        return [d for (d,) in self.con.execute("SELECT DISTINCT detector FROM entities ORDER BY 1").fetchall()]

    def sensitive_sentence_ids(self, categories: list[str], split: str | None = None) -> set[int]:
        """Sentences holding at least one entity of the chosen categories (the UeDP set E's sentences)."""
        self._require_entities()
        rows = self.con.execute(
            """
            SELECT DISTINCT e.sentence_id FROM entities e JOIN sentences s USING (sentence_id)
            WHERE list_contains(?, e.category) AND (? IS NULL OR s.split = ?)
            """,
            [categories, split, split],
        ).fetchall()
        return {r[0] for r in rows}

    def totals(self, categories: list[str]) -> dict[str, int]:
        """Corpus-wide counts for the chosen categories: sentences, sensitive sentences, the extended set S
        (sentences with no such entity: one extended entity each), entities, users, and how many entities
        span more than one user (the ones user-level DP alone does not protect)."""
        self._require_entities()
        row = self.con.execute(
            """
            WITH chosen AS (SELECT * FROM entities WHERE list_contains(?, category)),
                 per_entity AS (SELECT entity_key, count(DISTINCT user_id) AS users FROM chosen GROUP BY entity_key)
            SELECT (SELECT count(*) FROM sentences),
                   (SELECT count(DISTINCT sentence_id) FROM chosen),
                   (SELECT count(*) FROM per_entity),
                   (SELECT count(*) FROM users),
                   (SELECT count(DISTINCT user_id) FROM chosen),
                   (SELECT count(*) FROM per_entity WHERE users > 1),
                   (SELECT coalesce(max(users), 0) FROM per_entity)
            """,
            [categories],
        ).fetchone()
        assert row is not None  # a SELECT of scalar subqueries always yields one row
        sentences, sensitive, entities, users, users_with, multi_user, max_users = row
        return {"sentences": sentences, "sensitive_sentences": sensitive, "extended_set_S": sentences - sensitive,
                "entities": entities, "users": users, "users_with_entities": users_with,
                "entities_spanning_users": multi_user, "max_users_per_entity": max_users}

    def coverage(self, detector: str | list[str], coarse: dict[str, str | None], reference: str = "gold",
                 splits: tuple[str, ...] | None = None, predicted_categories: list[str] | None = None,
                 ) -> list[tuple[str, int, int, int, float, float, float]]:
        """Precision and recall of ``detector`` (or of the union of several) against ``reference`` spans,
        per coarse class.

        Returns ``(class, reference spans, predicted spans, exact matches, precision, recall,
        overlap recall)``. An exact match has the same sentence, offsets and coarse class; overlap
        recall counts a reference span as found when a predicted span of its class overlaps it.
        ``splits`` limits both sides to sentences of those splits (default: all);
        ``predicted_categories`` counts only predictions of those categories (what a run protects).
        """
        self._require_entities()
        self.con.execute("CREATE OR REPLACE TEMP TABLE coarse_map (category VARCHAR, coarse VARCHAR)")
        self.con.executemany("INSERT INTO coarse_map VALUES (?, ?)", [(k, v) for k, v in coarse.items() if v])
        rows = self.con.execute(
            """
            WITH spans AS (SELECT DISTINCT e.detector, e.sentence_id, e.start, e."end", m.coarse, e.category
                           FROM entities e JOIN coarse_map m USING (category) JOIN sentences s USING (sentence_id)
                           WHERE ? IS NULL OR list_contains(?, s.split)),
                 ref AS (SELECT * FROM spans WHERE detector = ?),
                 pred AS (SELECT DISTINCT sentence_id, start, "end", coarse FROM spans
                          WHERE list_contains(?, detector) AND (? IS NULL OR list_contains(?, category))),
                 found AS (SELECT r.coarse, count(p.sentence_id) > 0 AS overlap,
                                  bool_or(p.start = r.start AND p."end" = r."end") AS exact
                           FROM ref r LEFT JOIN pred p ON p.sentence_id = r.sentence_id AND p.coarse = r.coarse
                                AND p.start < r."end" AND r.start < p."end"
                           GROUP BY r.detector, r.sentence_id, r.start, r."end", r.coarse)
            SELECT f.coarse, count(*), (SELECT count(*) FROM pred p WHERE p.coarse = f.coarse),
                   count(*) FILTER (WHERE f.exact), count(*) FILTER (WHERE f.overlap)
            FROM found f GROUP BY f.coarse ORDER BY f.coarse
            """,
            [list(splits) if splits else None, list(splits) if splits else None, reference,
             [detector] if isinstance(detector, str) else list(detector), predicted_categories, predicted_categories],
        ).fetchall()
        return [(cls, n_ref, n_pred, tp, tp / n_pred if n_pred else 0.0, tp / n_ref, overlap / n_ref)
                for cls, n_ref, n_pred, tp, overlap in rows]
