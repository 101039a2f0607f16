"""Load spaCy pipelines the way users do: by installed package name or by folder path.

Nothing is downloaded at run time; when a named pipeline is not installed the error says exactly how
to install it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, cast

import spacy
from spacy.cli.info import info as spacy_info
from spacy.language import Language

from uedp.errors import UedpError


def load_pipeline(name_or_path: str) -> Language:
    path = Path(name_or_path).expanduser()
    if path.exists():
        try:
            return spacy.load(path)
        except (OSError, ValueError) as exc:
            raise UedpError(f"cannot load the spaCy pipeline folder {path}: {str(exc).splitlines()[0]}") from None
    if spacy.util.is_package(name_or_path):
        return spacy.load(name_or_path)
    raise UedpError(
        f"spaCy pipeline {name_or_path!r} is not installed and is not a folder; install it with "
        f"`python -m spacy download {name_or_path}` (or `pip install` its wheel from the spaCy models "
        f"release page on a machine with network access), or pass the path of a saved pipeline"
    )


def pipeline_identity(name_or_path: str) -> dict[str, str]:
    """What identifies a pipeline's predictions, for the detection cache key.

    A folder is identified by the hash of its files (a retrained model in the same folder is another
    model); an installed package by its name and version.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        digest = hashlib.sha256()
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            digest.update(str(file.relative_to(path)).encode())
            digest.update(hashlib.sha256(file.read_bytes()).digest())
        return {"path": str(path.resolve()), "content": digest.hexdigest()}
    # spaCy annotates info() as ``str | dict``; the str is only for markdown or URL output, never here.
    meta = cast(dict[str, Any], spacy_info(name_or_path)) if spacy.util.is_package(name_or_path) else {}
    return {"package": name_or_path, "version": str(meta.get("version", "unknown"))}
