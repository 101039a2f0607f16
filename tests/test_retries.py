"""Tasks retry transient failures (a crash, a lost connection) but not bad input, under a real Prefect."""

from __future__ import annotations

import pytest
from prefect import flow, task

from uedp.errors import UedpError
from uedp.tasks.retry import RETRIES, transient_only
from uedp.tasks.train import train_task

CALLS: list[str] = []


@task(retry_condition_fn=transient_only, retries=RETRIES, retry_delay_seconds=0)
def flaky(kind: str) -> str:
    CALLS.append(kind)
    if len(CALLS) == 1:
        raise OSError("connection reset") if kind == "transient" else UedpError("no such dataset 'x'")
    return "done"


@flow
def run_flaky(kind: str) -> str:
    return flaky(kind)


def test_transient_failures_retry_and_input_errors_do_not(prefect_server: None) -> None:
    CALLS.clear()
    assert run_flaky("transient") == "done" and CALLS == ["transient", "transient"]
    CALLS.clear()
    with pytest.raises(UedpError, match="no such dataset"):
        run_flaky("input")
    assert CALLS == ["input"]


def test_the_pipeline_tasks_use_that_policy() -> None:
    from uedp.tasks.detect import detect_task
    from uedp.tasks.ingest import ingest_task

    for t in (ingest_task, detect_task, train_task):
        assert t.retries == RETRIES and t.retry_condition_fn is transient_only
