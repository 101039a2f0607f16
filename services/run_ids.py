"""What an MLflow run id looks like (uuid4's 32 hexadecimal characters, as ``uedp train`` prints it), checked
before anything is imported or asked of a tracking server: a mistyped id is refused in a fraction of a second."""

from __future__ import annotations

import re

from uedp.errors import UedpError

RUN_ID_SHAPE = "32 hexadecimal characters, as `uedp train` prints it"
_RUN_ID = re.compile(r"[0-9a-f]{32}")


def is_run_id(text: str) -> bool:
    return _RUN_ID.fullmatch(text) is not None


def not_a_run_id(text: str) -> str:
    """The error for a value that cannot be a run id."""
    return f"{text!r} is not an MLflow run id ({RUN_ID_SHAPE})"


def require_run_ids(*given: str | None) -> None:
    """Refuse the first given value (None: not given) that cannot be a run id, naming it."""
    for text in given:
        if text is not None and not is_run_id(text):
            raise UedpError(not_a_run_id(text))
