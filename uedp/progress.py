"""Progress that reads well in a terminal and in a log file.

In a terminal: a tqdm bar redrawn in place. Anywhere else (a log file, a pipe, a Prefect worker's log):
tqdm's carriage returns pile up into one line tens of kilobytes long, so :class:`LineProgress` writes
a whole line instead, at every ``every_percent`` of the total and at least every ``every_seconds``,
plus one at the end: ``train userdp: 40/100 rounds (40%), 1m20s, about 2m00s left, epsilon 1.2``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any, Protocol

from tqdm.auto import tqdm

from uedp.interrupts import check


class Progress(Protocol):
    def update(self, n: int = 1) -> Any: ...
    def set_postfix(self, **values: Any) -> Any: ...
    def close(self) -> Any: ...


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class LineProgress:
    """A progress report of whole lines, for output that is not a terminal."""

    def __init__(self, total: int | None, desc: str, unit: str, stream: IO[str] | None = None,
                 every_percent: float = 10.0, every_seconds: float = 60.0, say: Callable[[str], Any] | None = None):
        self.total, self.desc, self.unit = total, desc, unit.strip()
        self.stream = stream if stream is not None else sys.stderr
        self.say = say  # where lines go instead of the stream (a Prefect run logger)
        self.every_percent, self.every_seconds = every_percent, every_seconds
        self.n, self.postfix = 0, ""
        self.started = self.last_line = time.monotonic()
        self.next_percent = every_percent
        self.closed = False
        # The estimate of time left is timed from the first update on: what comes before it (loading data,
        # a first evaluation, a checkpoint's restore) is no measure of the rate.
        self.rate_origin: tuple[float, int] | None = None

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if self.rate_origin is None:
            self.rate_origin = (now, self.n)
        percent = 100.0 * self.n / self.total if self.total else None
        if (percent is not None and percent >= self.next_percent and self.n < (self.total or 0)) \
                or now - self.last_line >= self.every_seconds:
            self._line(now)
            if percent is not None:
                while self.next_percent <= percent:
                    self.next_percent += self.every_percent

    def set_postfix(self, **values: Any) -> None:
        self.postfix = ", ".join(f"{key} {value}" for key, value in values.items())

    def close(self) -> None:
        if not self.closed and self.n:
            self._line(time.monotonic())
        self.closed = True

    def _line(self, now: float) -> None:
        elapsed = now - self.started
        if self.total:
            done = f"{self.n}/{self.total} {self.unit} ({100 * self.n / self.total:.0f}%)"
            left = ""
            if self.rate_origin is not None and self.rate_origin[1] < self.n < self.total:
                rate = (now - self.rate_origin[0]) / (self.n - self.rate_origin[1])
                left = f", about {_duration(rate * (self.total - self.n))} left"
        else:
            done, left = f"{self.n} {self.unit}", ""
        extra = f", {self.postfix}" if self.postfix else ""
        line = f"{self.desc}: {done}, {_duration(elapsed)}{left}{extra}"
        if self.say is not None:
            self.say(line)
        else:
            self.stream.write(line + "\n")
            self.stream.flush()
        self.last_line = now


class _Interruptible:
    """A progress report whose every update is also where a Ctrl-C lost elsewhere is raised
    (:mod:`uedp.interrupts`): a long step stops within one update."""

    def __init__(self, bar: Any):
        self.bar = bar

    def update(self, n: int = 1) -> Any:
        check()
        return self.bar.update(n)

    def set_postfix(self, **values: Any) -> Any:
        return self.bar.set_postfix(**values)

    def close(self) -> Any:
        return self.bar.close()

    def __getattr__(self, name: str) -> Any:  # tqdm's own attributes (n, total) for callers that read them
        return getattr(self.bar, name)


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **values: Any) -> None:
        pass

    def close(self) -> None:
        pass


def progress(total: int | None, desc: str, unit: str, enabled: bool = True,
             say: Callable[[str], Any] | None = None) -> Progress:
    """A tqdm bar on a terminal, whole lines elsewhere (to ``say`` when given: a flow run's logger),
    nothing when ``enabled`` is false."""
    if not enabled:
        return _Interruptible(_Silent())
    if say is not None:
        return _Interruptible(LineProgress(total, desc, unit, say=say))
    if sys.stderr.isatty():
        return _Interruptible(tqdm(total=total, desc=desc, unit=f" {unit.strip()}", mininterval=0.5, leave=False))
    return _Interruptible(LineProgress(total, desc, unit))
