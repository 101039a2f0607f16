"""A dataset declared public when it was ingested: the curator's statement that its text is public (a
public corpus used as a search's proxy or a pretraining corpus), kept beside its tables.

The declaration is not part of the tables' content key: declaring a dataset public changes what its runs
are charged, not its text. Ingesting the dataset again without the declaration withdraws it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from uedp.storage.home import DataHome
from uedp.storage.tables import write_json_atomically

DECLARATION_FILE = "declared_public.json"


def public_declaration(home: DataHome, dataset: str) -> str | None:
    """Why the dataset's text is public, as its curator declared at ingest; None for a private dataset."""
    file = home.dataset_dir(dataset) / DECLARATION_FILE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(data.get("why") or "declared public") if isinstance(data, dict) else None


def write_declaration(home: DataHome, dataset: str, why: str) -> None:
    """Record the declaration (atomically: a reader sees the previous state or the new one)."""
    write_json_atomically(home.dataset_dir(dataset) / DECLARATION_FILE,
                          {"why": why, "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")})


def withdraw_declaration(home: DataHome, dataset: str) -> bool:
    """Remove the declaration; whether there was one."""
    file = home.dataset_dir(dataset) / DECLARATION_FILE
    existed = file.is_file()
    file.unlink(missing_ok=True)
    return existed
