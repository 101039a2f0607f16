"""SimDial dialogs, as the Selective-DP paper's CustomerSim corpus ships them: one dialog per file
(``dial-N.txt``) in ``train/``, ``valid/`` and ``test/`` folders, one turn per line, ``SYS: ...`` (the
bot) or ``USR: ...`` (the customer).

Who is who. One dialog is one customer's conversation, so one dialog is one user (the privacy unit of
``userdp`` and ``uedp``) and one document. Each turn is one sentence (``dpsgd``'s unit, and a training
sequence): its text keeps the ``SYS:`` / ``USR:`` prefix, so a model learns who speaks, and a turn of
~20-120 bytes fits a byte-level model's context where a whole dialog (~400 bytes) would not. A user is
named by the folder and the file (``train/dial-17``): the same file name in ``valid/`` is another dialog.

The split is the folder's name (``train``, ``valid``/``dev``, ``test``); a folder with another name gives
none, and the ingest's split mode decides (by default: whole dialogs by a seeded hash).

The Selective-DP copy also plants its secret in ``train/canary-N.txt`` files ("My ID is 341752.", no
role). Such a file is read as plain lines, one sentence each, its own user; whether to ingest them is
the caller's choice (``uedp reproduce selective-customersim`` does not: it plants canaries of its own,
which its attack can score).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from uedp.storage.formats import FormatError, SourceRecord, read_lines, split_from_filename
from uedp.storage.formats.registry import CorpusFormat, register_format

if TYPE_CHECKING:
    from uedp.storage.ingest import IngestOptions

ROLES = ("SYS", "USR")
_TURN = re.compile(r"^(?:SYS|USR): ?\S")
CANARY_FILE = re.compile(r"^canary[-_]?\d*\.txt$", re.IGNORECASE)


def dialog_user(path: Path) -> str:
    """The user (and document) of a dialog file: its folder and its name without ``.txt``."""
    name = path.name[:-4] if path.name.lower().endswith(".txt") else path.name
    return f"{path.parent.name}/{name}" if path.parent.name else name


def split_of_folder(path: Path) -> str | None:
    """The split the file's folder names (``train``, ``valid``, ``dev``, ``test``), or None."""
    return split_from_filename(Path(path.parent.name)) if path.parent.name else None


def is_canary_file(path: Path) -> bool:
    """A Selective-DP copy's planted secret (``canary-3.txt``), not a dialog."""
    return bool(CANARY_FILE.match(path.name))


def simdial_records(path: Path) -> Iterator[SourceRecord]:
    """Each turn of one dialog file as a sentence of the dialog's user; a line that is not a turn is an
    error naming the file and the line (blank lines are skipped)."""
    user, split = dialog_user(path), split_of_folder(path)
    plain = is_canary_file(path)
    produced = False
    for lineno, line in read_lines(path):
        text = line.strip()
        if not text:
            continue
        if not plain and not _TURN.match(text):
            shown = text if len(text) <= 60 else text[:57] + "..."
            raise FormatError(path, lineno, f"expected a turn 'SYS: ...' or 'USR: ...', got {shown!r} (is this a "
                              "SimDial dialog file?)")
        produced = True
        yield SourceRecord(text=text, user=user, doc_id=user, line=lineno, split=split)
    if not produced:
        raise FormatError(path, None, "no turns found (empty dialog file?)")


def _read(path: Path, options: IngestOptions) -> Iterator[SourceRecord]:
    return simdial_records(path)


register_format(CorpusFormat(
    name="simdial", summary="SimDial / CustomerSim dialogs (dial-N.txt in train/, valid/, test/), one user per dialog",
    read=_read, default_users="dialog", fixed_users=True,
    more_users="each dialog file is one user: ingest more dialogs",
    file_patterns=("dial-*.txt", "*/dial-*.txt"),
))
