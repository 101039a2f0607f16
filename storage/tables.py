"""Atomic Parquet tables with manifests: a crash or a bad input never leaves a half-written table.

A table is a folder holding ``data.parquet`` and ``manifest.json``. Writers fill a hidden temporary
folder next to it and swap it in by rename only after every row was written, so readers always see
the previous good table or the new complete one. The manifest records the content key the table was
built from (input hashes, configuration); callers compare keys to skip work that is already done.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from uedp.errors import UedpError
from uedp.storage.schemas import SCHEMA_VERSION

DATA_FILE = "data.parquet"
MANIFEST_FILE = "manifest.json"


def hash_files(paths: Iterable[Path], chunk: int = 1 << 20) -> str:
    """SHA-256 over the bytes of the files, in the given order (names excluded: content is the key)."""
    digest = hashlib.sha256()
    for path in paths:
        file_digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while block := handle.read(chunk):
                file_digest.update(block)
        digest.update(file_digest.digest())
    return digest.hexdigest()


def hash_config(config: dict[str, Any]) -> str:
    """Stable hash of a JSON-serialisable configuration (key order does not matter)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def read_manifest(table_dir: Path) -> dict[str, Any] | None:
    """The manifest of a complete table, or None when the table does not exist."""
    path = table_dir / MANIFEST_FILE
    if not path.is_file() or not (table_dir / DATA_FILE).is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UedpError(f"{path}: not a table manifest ({exc}); the table was damaged after it was written: "
                        "write it again (ingest, detect, sanitize or generate the dataset again)") from None
    if not isinstance(manifest, dict):
        raise UedpError(f"{path}: not a table manifest (a JSON {type(manifest).__name__}, not an object); "
                        "write the table again")
    return manifest


def is_current(table_dir: Path, key: str) -> bool:
    """True when the table exists and was built from exactly this content key."""
    manifest = read_manifest(table_dir)
    return manifest is not None and manifest.get("key") == key and manifest.get("schema_version") == SCHEMA_VERSION


def read_table(table_dir: Path) -> pa.Table:
    return pq.read_table(table_dir / DATA_FILE)


def write_json_atomically(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file renamed over it: a reader sees the previous
    file or the new one, never half of it, and a failure leaves no temporary behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        temporary.write_text(json.dumps(data), encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def table_columns(table_dir: Path) -> list[tuple[str, str]]:
    """A complete table's column names and Arrow types, read from the Parquet footer (no rows): what the
    code writes, so naming it releases nothing about the text."""
    return [(field.name, str(field.type)) for field in pq.read_schema(table_dir / DATA_FILE)]


class TableWriter:
    """Stream record batches into a table folder; swapped in atomically on a clean exit only.

    >>> with TableWriter(path, schema, key="...", details={...}) as writer:
    ...     writer.write_rows(rows)
    """

    def __init__(self, table_dir: Path, schema: pa.Schema, key: str, details: dict[str, Any] | None = None):
        self.table_dir = table_dir
        self.schema = schema
        self.key = key
        self.details = dict(details or {})
        self.rows = 0
        # The writer's PID in the name: a later writer can tell a folder a killed process left behind
        # from one a live process is still filling.
        self._tmp = table_dir.parent / f".{table_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._writer: pq.ParquetWriter | None = None

    def __enter__(self) -> TableWriter:
        remove_stale_temporaries(self.table_dir)
        self._tmp.mkdir(parents=True)
        self._writer = pq.ParquetWriter(self._tmp / DATA_FILE, self.schema, compression="zstd")
        return self

    def write_rows(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            self.write_batch(pa.RecordBatch.from_pylist(rows, schema=self.schema))

    def side_file(self, name: str) -> Path:
        """Where to write a file that belongs with this table (swapped in with it, or dropped with it).
        Only the data and the manifest are pushed to a table store: a side file stays in this home."""
        if name in (DATA_FILE, MANIFEST_FILE) or "/" in name or name.startswith("."):
            raise ValueError(f"{name!r} cannot be a side file of a table")
        return self._tmp / name

    def write_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        assert self._writer is not None, "use TableWriter as a context manager"
        self._writer.write(batch)
        self.rows += batch.num_rows

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._writer is not None
        self._writer.close()
        if exc_type is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            return
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "table": self.table_dir.name,
            "rows": self.rows,
            "key": self.key,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            **self.details,
        }
        (self._tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")
        swap_in(self._tmp, self.table_dir)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(table_dir: Path) -> list[Path]:
    """Remove the half-written folders of ``table_dir`` whose writer died (``kill -9``, power loss):
    ``.<table>.tmp-<pid>-*`` and ``.<table>.old-<pid>-*`` of a process that no longer runs, and those of
    older uedp versions, which carry no PID. A live writer's folder is left alone. Returns what went."""
    removed: list[Path] = []
    if not table_dir.parent.is_dir():
        return removed
    if not table_dir.exists():  # a writer died between swap_in's two renames: its .old- is the last good table
        olds = sorted(table_dir.parent.glob(f".{table_dir.name}.old-*"), key=lambda p: p.stat().st_mtime)
        if olds and (olds[-1] / MANIFEST_FILE).is_file():
            os.replace(olds[-1], table_dir)
    for kind in ("tmp", "old"):
        for folder in table_dir.parent.glob(f".{table_dir.name}.{kind}-*"):
            owner = folder.name.removeprefix(f".{table_dir.name}.{kind}-").split("-")[0]
            if (len(owner) == 8 and not owner.isdigit()) or (owner.isdigit() and not _process_alive(int(owner))):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    return removed


def swap_in(new_dir: Path, target: Path) -> None:
    """Replace ``target`` by ``new_dir`` with renames, so a reader never sees a partial folder."""
    old = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if target.exists():
        os.replace(target, old)
    os.replace(new_dir, target)
    shutil.rmtree(old, ignore_errors=True)
