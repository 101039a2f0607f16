"""Detection: sentences into the entities table, cached by (corpus content, detector config, taxonomy).

One pass (:func:`detect_entities`) or, to scale out, a map over row-range shards (:func:`detect_shard`, which
``tasks.detect`` lets a Dask or Ray task runner spread over processes and machines) followed by :func:`merge_shards`. Both
give the same table with the same content key, so either reuses the other's result.
"""

from __future__ import annotations

import math
import posixpath
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from uedp.detection.categories import taxonomy
from uedp.detection.identity import IDENTITY_VERSION
from uedp.detection.pipeline import DetectorConfig, detect, read_ignore_list
from uedp.errors import UedpError
from uedp.progress import progress as progress_bar
from uedp.services.coverage import store_coverage
from uedp.services.ner import refuse_ner_fitted_to_training_text
from uedp.storage.catalog import Catalog, CommonEntity
from uedp.storage.formats.registry import formats
from uedp.storage.home import DataHome
from uedp.storage.manifests import entities_manifest_in, sentences_manifest_in
from uedp.storage.remote import TableStore, open_store
from uedp.storage.schemas import ENTITIES
from uedp.storage.tables import DATA_FILE, TableWriter, hash_config, is_current

COLUMNS = ["sentence_id", "user_id", "text", "gold_spans"]
STAGING_PREFIX = ".entities.shards-"


@dataclass(frozen=True)
class DetectResult:
    dataset: str
    detector: str
    reused: bool
    entities: int
    shards: int = 1


@dataclass(frozen=True)
class DetectionWork:
    """What detecting a dataset will write: the content key, and where the sentences come from."""

    dataset: str
    key: str
    detector: str
    sentences_file: Path
    entities_dir: Path
    details: dict[str, Any]
    rows: int

    def reused(self) -> DetectResult | None:
        """The existing entities table's result, when it was built from exactly this key."""
        if not is_current(self.entities_dir, self.key):
            return None
        written = entities_manifest_in(self.entities_dir)
        if written is None or written.sentences_key != self.details["sentences_key"]:
            return None  # written by an older uedp, which did not record its sentences: rebuild it
        return DetectResult(self.dataset, self.detector, True, written.rows)


@dataclass(frozen=True)
class Shard:
    """Sentence rows ``[start, stop)`` of the sentences table: one unit of parallel detection."""

    index: int
    start: int
    stop: int

    @property
    def part_name(self) -> str:
        return f"part-{self.index:05d}.parquet"


def plan_detection(home: DataHome, dataset: str, config: DetectorConfig) -> DetectionWork:
    sentences_dir = home.table_dir(dataset, "sentences")
    sentences = sentences_manifest_in(sentences_dir)
    if sentences is None:
        raise UedpError(f"dataset {dataset!r} has no sentences table under {home.dataset_dir(dataset)}; ingest it first")
    source_format = sentences.source_format
    gold_formats = sorted(name for name, f in formats().items() if f.gold)  # read now: formats may register late
    if "gold" in config.detectors and source_format and source_format not in gold_formats:
        raise UedpError(f"dataset {dataset!r} was ingested from {source_format} files, which carry no gold entity tags "
                        f"(only {', '.join(gold_formats)} does); detect with --detector presidio or spacy "
                        "and --spacy-model NAME_OR_PATH")
    tax = taxonomy(home.labels_file)
    if "gold" in config.detectors:  # every unknown tag of the corpus at once, before any row is written
        tax.refuse_unknown(gold_labels(sentences_dir / DATA_FILE), f"the gold tags of dataset {dataset!r}", dataset)
    key = hash_config({"sentences": sentences.key, "detector": config.identity(), "entity_identity": IDENTITY_VERSION,
                       "taxonomy": tax.digest})
    details = {"detector": config.model_dump(exclude={"batch_size", "workers"}), "taxonomy": tax.source,
               "taxonomy_digest": tax.digest, "entity_identity": IDENTITY_VERSION, "sentences_key": sentences.key}
    if config.ignore_entities:  # how many surfaces the curator listed: said in every entity-level run's caveats
        details["ignored_surfaces"] = read_ignore_list(config.ignore_entities).surfaces
    return DetectionWork(dataset, key, "+".join(config.detectors), sentences_dir / DATA_FILE,
                         home.table_dir(dataset, "entities"), details, sentences.rows)


def gold_labels(sentences_file: Path) -> set[str]:
    """The distinct labels of a sentences table's gold spans (a tag set's names, no text, no counts)."""
    spans = pq.read_table(sentences_file, columns=["gold_spans"]).column("gold_spans")
    flat = pc.list_flatten(spans)
    return {str(label) for label in pc.unique(pc.struct_field(flat, "label")).to_pylist() if label is not None}


def detect_entities(home: DataHome, dataset: str, config: DetectorConfig | None = None,
                    progress: bool = False, store_url: str | None = None) -> DetectResult:
    """Write the dataset's entities table in one pass, unless one built from the same content and config
    exists (here, or in the table store, which the sentences come from and the entities go to)."""
    store = open_store(store_url)
    if store:
        store.pull_required(home, dataset, ("sentences",))
        store.pull(home, dataset, "entities")
    result = _detect_here(home, dataset, config or DetectorConfig(), progress)
    if store:
        store.push(home, dataset, "entities")
    return result


def _detect_here(home: DataHome, dataset: str, config: DetectorConfig, progress: bool) -> DetectResult:
    plan = plan_detection(home, dataset, config)
    check_independent_of_training_text(home, dataset, config)
    if (reused := plan.reused()) is not None:
        return reused
    bar = progress_bar(plan.rows, f"detect {dataset}", "sentences", enabled=progress)

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in pq.ParquetFile(plan.sentences_file).iter_batches(batch_size=2_000, columns=COLUMNS):
            yield batch
            bar.update(batch.num_rows)

    with TableWriter(plan.entities_dir, ENTITIES, plan.key, plan.details) as writer:
        for rows in detect(batches(), config, taxonomy(home.labels_file)):
            writer.write_rows(rows)
    bar.close()
    store_coverage(home, dataset)
    return DetectResult(dataset, plan.detector, False, writer.rows)


# --- after detection: the entities held by the most users (the curator's terminal only) ---------------
COMMON_ENTITIES = 10
# An entity held by more than this share of a dataset's users is more often a detector's false positive than
# a name the users share. Chosen from CoNLL-2003's gold tags (documents as users): the most widely held gold
# entity is "U.S." (LOC), in 172 of 1,393 documents (12.3%; 13.9% within the valid split alone, "London" 13.4%
# in test), while the false positives of issue 37 held 80% ("<unk>" as ORG in 98 of 122 WikiText articles) to
# 100% ("Hello" as PERSON in 300 dialogs). A quarter is about twice the largest real share.
SHARED_ENTITY_WARNING = 0.25
MIN_HOLDERS_TO_WARN = 10  # among a handful of users, any shared entity is a large share


@dataclass(frozen=True)
class EntityChecks:
    """The entities held by the most users, and those held by more than :data:`SHARED_ENTITY_WARNING` of them.

    Entity text and exact counts of private data: for the curator's terminal only (printed by the CLI
    command), never a flow's or task's log, MLflow or a file (docs/PRIVACY.md)."""

    common: list[CommonEntity]
    widespread: list[CommonEntity]

    def warnings(self) -> list[str]:
        return [f"{e.category} {e.surface!r} is held by {e.users} of {e.of_users} users ({e.share:.0%}): an entity "
                f"this widespread is more often a detector false positive (a greeting, a placeholder like <unk>, a "
                f"year read as a phone number) than a person or place; if it is one, list it in a file "
                f"({e.category}: {e.surface}) and detect again with --ignore-entities FILE"
                for e in self.widespread]


def entity_checks(home: DataHome, dataset: str, limit: int = COMMON_ENTITIES) -> EntityChecks | None:
    """The entities table's most widely held entities (None when the dataset has no current entities table)."""
    with Catalog(home, dataset) as catalog:
        if "entities" not in catalog.tables:
            return None
        common = catalog.common_entities(limit)
        users = common[0].of_users if common else 0
        floor = max(MIN_HOLDERS_TO_WARN, math.floor(SHARED_ENTITY_WARNING * users) + 1)
        return EntityChecks(common, catalog.common_entities(None, min_users=floor))


# --- sharded detection: map over row ranges, then merge ------------------------------------------
def plan_shards(plan: DetectionWork, rows_per_shard: int) -> list[Shard]:
    if rows_per_shard < 1:
        raise UedpError(f"rows per shard must be at least 1, not {rows_per_shard}")
    return [Shard(i, start, min(start + rows_per_shard, plan.rows))
            for i, start in enumerate(range(0, max(plan.rows, 1), rows_per_shard))]


def shards_to_detect(home: DataHome, dataset: str, config: DetectorConfig, rows_per_shard: int,
                     store_url: str | None = None) -> DetectResult | list[Shard]:
    """Before a sharded pass: the tables from the store (when there is one), then either the reused
    result (same corpus and detector configuration) or the shards still to detect."""
    store = open_store(store_url)
    if store:
        store.pull_required(home, dataset, ("sentences",))
        store.pull(home, dataset, "entities")
    plan = plan_detection(home, dataset, config)
    check_independent_of_training_text(home, dataset, config)
    reused = plan.reused()
    return reused if reused is not None else plan_shards(plan, rows_per_shard)


def check_independent_of_training_text(home: DataHome, dataset: str, config: DetectorConfig) -> None:
    """Refuse detection whose spaCy pipeline `uedp ner train` fitted to this dataset's training text (also a
    table detected so before: reusing it would be the same): services.ner explains why."""
    if config.needs_nlp:
        refuse_ner_fitted_to_training_text(home, dataset, config.spacy_model, f"uedp detect {dataset}")


class Staging:
    """Where shard results wait for the merge: a folder named by the detection key, in the table store
    when there is one (shards may run on other machines) or next to the local table. A finished part
    survives a failed run, so a rerun detects only the missing shards."""

    def __init__(self, home: DataHome, plan: DetectionWork, store: TableStore | None):
        base = store.table_path(plan.dataset, "") if store else str(home.dataset_dir(plan.dataset))
        self.fs = store.fs if store else fsspec.filesystem("file")
        self.folder = posixpath.join(base.rstrip("/"), STAGING_PREFIX + plan.key[:16])

    def has(self, shard: Shard) -> bool:
        return bool(self.fs.exists(posixpath.join(self.folder, shard.part_name)))

    def put(self, local_file: Path, shard: Shard) -> None:
        """Upload under a temporary name, then move: a part is either complete or absent."""
        self.fs.makedirs(self.folder, exist_ok=True)
        tmp = posixpath.join(self.folder, f".{shard.part_name}.{uuid.uuid4().hex[:8]}")
        self.fs.put_file(str(local_file), tmp)
        self.fs.mv(tmp, posixpath.join(self.folder, shard.part_name))

    def get(self, shard: Shard, local_file: Path) -> None:
        self.fs.get_file(posixpath.join(self.folder, shard.part_name), str(local_file))

    def clear(self) -> None:
        if self.fs.exists(self.folder):
            self.fs.rm(self.folder, recursive=True)


def read_shard(sentences_file: Path, shard: Shard) -> pa.Table:
    """The shard's rows, reading only the row groups that overlap it."""
    parquet = pq.ParquetFile(sentences_file)
    groups, first, offset = [], None, 0
    for index in range(parquet.metadata.num_row_groups):
        size = parquet.metadata.row_group(index).num_rows
        if offset < shard.stop and offset + size > shard.start:
            groups.append(index)
            first = offset if first is None else first
        offset += size
    if not groups:  # an empty corpus: one empty shard
        return parquet.read(columns=COLUMNS).slice(0, 0)
    table = parquet.read_row_groups(groups, columns=COLUMNS)
    return table.slice(shard.start - first, shard.stop - shard.start)  # type: ignore[operator]


def detect_shard(home: DataHome, dataset: str, config: DetectorConfig, shard: Shard,
                 store_url: str | None = None) -> int:
    """Detect one shard into its staged part; a part that is already staged is kept (returns -1)."""
    store = open_store(store_url)
    if store:
        store.pull_required(home, dataset, ("sentences",))
    plan = plan_detection(home, dataset, config)
    staging = Staging(home, plan, store)
    if staging.has(shard):
        return -1
    rows = read_shard(plan.sentences_file, shard)
    with tempfile.TemporaryDirectory(dir=home.root) as tmp:
        part = Path(tmp) / shard.part_name
        with pq.ParquetWriter(part, ENTITIES, compression="zstd") as writer:
            count = 0
            for chunk in detect(rows.to_batches(max_chunksize=2_000), config, taxonomy(home.labels_file)):
                if chunk:
                    writer.write_table(pa.Table.from_pylist(chunk, schema=ENTITIES))
                    count += len(chunk)
        staging.put(part, shard)
    return count


def merge_shards(home: DataHome, dataset: str, config: DetectorConfig, shards: list[Shard],
                 store_url: str | None = None) -> DetectResult:
    """Concatenate the staged parts in shard order into the entities table (atomic), publish it to
    the store when there is one, and drop the staging folder."""
    store = open_store(store_url)
    plan = plan_detection(home, dataset, config)
    staging = Staging(home, plan, store)
    missing = [s.index for s in shards if not staging.has(s)]
    if missing:
        raise UedpError(f"cannot merge detection of {dataset!r}: shards {missing} have no staged result in {staging.folder}")
    with TableWriter(plan.entities_dir, ENTITIES, plan.key, plan.details | {"shards": len(shards)}) as writer, \
            tempfile.TemporaryDirectory(dir=home.root) as tmp:
        for shard in shards:
            local = Path(tmp) / shard.part_name
            staging.get(shard, local)
            writer.write_batch(pq.read_table(local, schema=ENTITIES))
            local.unlink()
    if store:
        store.push(home, dataset, "entities")
    staging.clear()
    store_coverage(home, dataset)
    return DetectResult(dataset, plan.detector, False, writer.rows, len(shards))
