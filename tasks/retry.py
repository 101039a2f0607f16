"""When a failed task is worth retrying: a crash, a lost connection, a full disk, an out-of-memory
device; not the user's input or a refusal on privacy grounds, which fail the same way every time.
A retried training resumes from its last checkpoint, so a retry spends no privacy twice."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from uedp.errors import UedpError

PERMANENT = (UedpError, ValidationError, ValueError, TypeError, KeyError)
RETRIES = {"retries": 2, "retry_delay_seconds": 30}


def transient_only(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's ``retry_condition_fn``: retry unless the failure's exception is a permanent kind."""
    return not isinstance(state.data, PERMANENT)
