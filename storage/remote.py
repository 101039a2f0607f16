"""A shared table store on any fsspec filesystem (``s3://``, ``gs://``, ``abfs://``, ``file://``): how
several machines see the same datasets.

Each machine keeps its own :class:`storage.home.DataHome` as a cache; the store is the system of
record. A table is published as an immutable data file named by its content key plus a manifest
written last, so a reader that finds a manifest always finds the complete file it names, even while
another machine publishes a newer version::

    <url>/datasets/<dataset>/<table>/manifest.json          # {"key": ..., "data": "<key16>.parquet", ...}
    <url>/datasets/<dataset>/<table>/<key16>.parquet

``pull`` copies a table into the local home only when the keys differ, through the same atomic swap
as every local write. The object-store driver (``s3fs``, ``gcsfs``, ``adlfs``) is the user's install.
"""

from __future__ import annotations

import json
import posixpath
import shutil
import uuid
from importlib.resources import files as package_files
from pathlib import Path
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from uedp.errors import UedpError
from uedp.storage.home import DataHome, validate_dataset_name
from uedp.storage.tables import DATA_FILE, MANIFEST_FILE, read_manifest, swap_in


class TableStore:
    """Tables of every dataset under one fsspec URL."""

    def __init__(self, url: str):
        try:
            self.fs, self.root = url_to_fs(url)
        except (ImportError, ValueError) as exc:  # e.g. s3:// without s3fs installed
            raise UedpError(f"cannot open table store {url!r}: {exc}") from None
        self.url = url

    def __repr__(self) -> str:
        return f"TableStore({self.url!r})"

    def table_path(self, dataset: str, table: str) -> str:
        return posixpath.join(self.root, "datasets", validate_dataset_name(dataset), table)

    def manifest(self, dataset: str, table: str) -> dict[str, Any] | None:
        path = posixpath.join(self.table_path(dataset, table), MANIFEST_FILE)
        if not self.fs.exists(path):
            return None
        with self.fs.open(path, "r", encoding="utf-8") as handle:
            manifest: dict[str, Any] = json.load(handle)
            return manifest

    def push(self, home: DataHome, dataset: str, table: str) -> str:
        """Publish the local table (data first, manifest last); returns its key. A no-op when current."""
        local_dir = home.table_dir(dataset, table)
        manifest = read_manifest(local_dir)
        if manifest is None:
            raise UedpError(f"no local {table} table for dataset {dataset!r} under {home.root} to publish")
        remote = self.manifest(dataset, table)
        if remote is not None and remote.get("key") == manifest["key"]:
            return str(manifest["key"])
        folder = self.table_path(dataset, table)
        data_name = f"{str(manifest['key'])[:16]}.parquet"
        self.fs.makedirs(folder, exist_ok=True)
        self.fs.put_file(str(local_dir / DATA_FILE), posixpath.join(folder, data_name))
        with self.fs.open(posixpath.join(folder, MANIFEST_FILE), "w", encoding="utf-8") as handle:
            json.dump(manifest | {"data": data_name}, handle, indent=2, sort_keys=True)
        return str(manifest["key"])

    def pull(self, home: DataHome, dataset: str, table: str) -> bool:
        """Bring the store's version of a table into the local home; False when the store has none."""
        remote = self.manifest(dataset, table)
        if remote is None:
            return False
        local_dir = home.table_dir(dataset, table)
        local = read_manifest(local_dir)
        if local is not None and local.get("key") == remote.get("key"):
            return True
        local_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = local_dir.parent / f".{table}.pull-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            self.fs.get_file(posixpath.join(self.table_path(dataset, table), remote["data"]), str(tmp / DATA_FILE))
            manifest = {k: v for k, v in remote.items() if k != "data"}
            (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        swap_in(tmp, local_dir)
        return True

    def pull_required(self, home: DataHome, dataset: str, tables: tuple[str, ...]) -> None:
        """Pull tables the next step needs; a table absent from the store is an error naming it."""
        for table in tables:
            if not self.pull(home, dataset, table) and read_manifest(home.table_dir(dataset, table)) is None:
                raise UedpError(f"table store {self.url} has no {table} table for dataset {dataset!r}; "
                                f"run the step that writes it with the same store")


def open_store(url: str | None) -> TableStore | None:
    """``None`` (no store: one machine, the local home only) or the store at ``url``."""
    return TableStore(url) if url else None


BUNDLED = "bundled:"  # an input shipped inside the package (bundled:demo.conll), so defaults work anywhere


def bundled_file(name: str) -> Path:
    """A corpus shipped with uedp (``uedp/data``): what deployment defaults point at on a fresh machine."""
    folder = Path(str(package_files("uedp") / "data"))
    path = folder / name
    if "/" in name or not path.is_file():
        shipped = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("_"))
        raise UedpError(f"no bundled corpus {name!r}; uedp ships: {', '.join(shipped)}")
    return path


def fetch_inputs(urls: list[str], into: Path) -> list[Path]:
    """Local paths for input files: local paths as they are, remote URLs copied into ``into`` (by name,
    one folder per URL so equal names do not collide). Ingest hashes content, so a copy reuses tables."""
    paths: list[Path] = []
    for index, url in enumerate(urls):
        if url.startswith(BUNDLED):
            paths.append(bundled_file(url.removeprefix(BUNDLED)))
            continue
        protocol = fsspec.utils.get_protocol(url)
        if protocol in ("file", "local"):
            paths.append(Path(url.removeprefix("file://")))
            continue
        try:
            fs, path = url_to_fs(url)
        except (ImportError, ValueError) as exc:
            raise UedpError(f"cannot open input {url!r}: {exc}") from None
        target = into / f"{index:03d}" / posixpath.basename(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not fs.exists(path):
            raise UedpError(f"input {url} does not exist")
        fs.get_file(path, str(target))
        paths.append(target)
    return paths
