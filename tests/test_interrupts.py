"""Ctrl-C is obeyed however it lands (issue 68, 1): Python drops a ``KeyboardInterrupt`` raised inside a
finalizer or a weak-reference callback, which an ingest writing Parquet batches runs all the time, and
`uedp ingest` used to run to the end after SIGINT, exiting 0 with the whole dataset. The CLI remembers
SIGINT and every progress update raises it where it propagates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from uedp import interrupts
from uedp.progress import progress


@pytest.fixture
def installed() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupts.install()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        interrupts.clear()


class _Garbage:
    pass


def _sigint_inside_a_finalizer() -> None:
    """SIGINT delivered while a weak-reference callback runs: the interrupt it raises there is dropped."""
    def finalizer() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at the next bytecode, here: inside the callback
            pass

    garbage = _Garbage()
    weakref.finalize(garbage, finalizer)
    del garbage  # the callback runs now, and Python prints "Exception ignored" for its KeyboardInterrupt


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped interrupt, by design
@pytest.mark.usefixtures("installed")
def test_an_interrupt_lost_in_a_finalizer_is_raised_at_the_next_progress_update() -> None:
    bar = progress(100, "ingest x", "sentences", enabled=False)
    _sigint_inside_a_finalizer()  # nothing propagates from here
    with pytest.raises(KeyboardInterrupt):
        bar.update(10)
    bar.update(10)  # raised once: a command that caught it may go on


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_without_the_flag_the_lost_interrupt_is_gone() -> None:
    """What the fix is for: Python's own handler alone loses it (so the test above can fail)."""
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _sigint_inside_a_finalizer()
        try:
            interrupts.check()  # nothing remembered: the interrupt is lost
        except KeyboardInterrupt:
            pytest.fail("Python's own handler remembered the interrupt: the flag would be needless")
    finally:
        signal.signal(signal.SIGINT, previous)


def _large_corpus(path: Path, documents: int = 40_000) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for index in range(documents):
            for sentence in range(4):
                out.write(json.dumps({"text": f"Report {index} line {sentence}: sales in Leeds rose {index % 97} "
                                              "percent against the year before .", "user": f"u{index % 900}"}) + "\n")
    return path


@pytest.mark.slow
def test_ctrl_c_while_an_ingest_writes_stops_it_says_so_and_leaves_nothing(tmp_path: Path) -> None:
    corpus = _large_corpus(tmp_path / "filings.jsonl")
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {"UEDP_HOME": str(home)}
    command = subprocess.Popen([sys.executable, "-m", "uedp.cli", "ingest", "jsonl", str(corpus), "--name", "filings",
                                "--text-col", "text", "--user-col", "user"], env=env, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    writing = home / "datasets" / "filings"
    while time.monotonic() < deadline and not (writing.is_dir() and any(".tmp-" in p.name for p in writing.iterdir())):
        assert command.poll() is None, command.communicate()
        time.sleep(0.05)
    assert time.monotonic() < deadline, "the ingest never began writing"
    time.sleep(0.5)
    os.killpg(command.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole foreground process group
    interrupted = time.monotonic()
    _, stderr = command.communicate(timeout=60)
    assert command.returncode == 130, stderr[-2000:]
    assert time.monotonic() - interrupted < 20  # stopped, not finished (the whole ingest takes longer)
    assert "interrupted (Ctrl-C)" in stderr and "Connection refused" not in stderr  # its server was not stopped first
    assert not writing.exists() or not any(writing.iterdir()), list(writing.iterdir())
