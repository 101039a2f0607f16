"""Ctrl-C that is never lost.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be when SIGINT arrives, and when
that is a finalizer or a weak-reference callback (which a loop building many short-lived objects, such as
an ingest writing Parquet batches, runs all the time), the exception is printed as "Exception ignored" and
dropped: the command runs on to the end as if nobody had pressed Ctrl-C. :func:`install` (the CLI calls it)
makes SIGINT also set a flag, and :func:`check` (every progress update calls it) raises the interrupt
there, at a point where it propagates, so a long step stops within one progress update.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_requested = threading.Event()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _requested.set()
    raise KeyboardInterrupt


def install() -> None:
    """SIGINT raises ``KeyboardInterrupt`` as by default and is remembered until :func:`check` raises it
    again. Only in the main thread, and only over Python's default handler (a handler someone else set is
    theirs)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is \
            signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def check() -> None:
    """Raise ``KeyboardInterrupt`` when a SIGINT arrived since the last check (whether or not the interrupt
    it raised was lost in a finalizer); the flag is cleared, so the interrupt is raised once."""
    if _requested.is_set():
        _requested.clear()
        raise KeyboardInterrupt


def clear() -> None:
    """Forget a SIGINT that was handled (the command caught its interrupt and goes on)."""
    _requested.clear()
