"""When a failed task is worth retrying: a crash, a lost connection, a full disk, an out-of-memory
device; not the user's input or a refusal on privacy grounds, which fail the same way every time.
A retried training resumes from its last checkpoint, so a retry spends no privacy twice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE
from pydantic import ValidationError

from uedp.errors import UedpError

PERMANENT = (UedpError, ValidationError, ValueError, TypeError, KeyError)
RETRIES = 2
RETRY_DELAY_SECONDS = 30
P = ParamSpec("P")
R = TypeVar("R")


def transient_only(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's ``retry_condition_fn``: retry unless the failure's exception is a permanent kind."""
    return not isinstance(state.data, PERMANENT)


def retried_task(name: str, task_run_name: str | None = None) -> Callable[[Callable[P, R]], Task[P, R]]:
    """uedp's tasks: never cached (inputs are content-keyed by the tasks themselves), retried on transient
    failures only."""
    return task(name=name, cache_policy=NO_CACHE, task_run_name=task_run_name, retries=RETRIES,
                retry_delay_seconds=RETRY_DELAY_SECONDS, retry_condition_fn=transient_only)
