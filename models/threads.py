"""How many threads torch may use for one operation (intra-op parallelism).

torch's own default is the machine's core count, whatever share of it this process may use: two jobs
on one 2-core machine then run four threads on two cores, and each step waits for a descheduled
thread (``benchmarks/threads_under_load.py``: a tiny GPT-2 step went from 11.5 ms to 175 ms with one
other busy process). uedp uses, in order: the ``--threads`` a user gives; ``OMP_NUM_THREADS`` when set
(the user already chose); else the CPUs that are free: those in this process' affinity mask (``taskset``,
cgroup cpusets) less the CPUs other processes keep busy, measured from ``/proc/stat`` over a fifth of a
second (:func:`free_cpus`), divided among the torchrun processes on this machine (``LOCAL_WORLD_SIZE``)
and the trainings a machine runs at once (``UEDP_CONCURRENT_TRAININGS``, for workers that run several);
at least one. :meth:`ThreadChoice.line` says which, in a line a training prints before it starts.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

import torch

# cpu index -> (idle, total) clock ticks since boot, from /proc/stat's per-CPU lines
CpuTimes = dict[int, tuple[int, int]]
MEASURE_SECONDS = 0.2
# A CPU counts as free when at most a quarter of it is busy with other work: an OpenMP thread on a CPU
# another process holds half the time stalls every step's other threads with it.
FREE_MARGIN = 0.25
CONCURRENT_TRAININGS = "UEDP_CONCURRENT_TRAININGS"


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), not the machine's count."""
    return len(_affinity())


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this platform (macOS)
        return set(range(os.cpu_count() or 1))


def read_proc_stat(path: str = "/proc/stat") -> CpuTimes:
    """Per-CPU ``(idle, total)`` ticks from ``/proc/stat`` (idle counts iowait; total leaves out guest
    time, which user and nice already include). Raises OSError where there is no such file."""
    times: CpuTimes = {}
    with open(path, encoding="ascii") as lines:
        for line in lines:
            name, *fields = line.split()
            if not (name.startswith("cpu") and name[3:].isdigit()):
                continue
            ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            times[int(name[3:])] = (ticks[3] + (ticks[4] if len(ticks) > 4 else 0), sum(ticks))
    return times


def busy_cpus(before: CpuTimes, after: CpuTimes, cpus: Collection[int]) -> float:
    """CPUs' worth of time the CPUs ``cpus`` were busy between two snapshots of :func:`read_proc_stat`
    (a CPU missing from either, or with no ticks in between, counts as idle)."""
    busy = 0.0
    for cpu in cpus:
        if cpu not in before or cpu not in after:
            continue
        idle, total = after[cpu][0] - before[cpu][0], after[cpu][1] - before[cpu][1]
        if total > 0:
            busy += min(1.0, max(0.0, 1.0 - idle / total))
    return busy


def free_cpus(cpus: int, busy: float) -> int:
    """Whole CPUs free of ``cpus`` when other work keeps ``busy`` CPUs' worth busy (:data:`FREE_MARGIN`)."""
    return min(cpus, max(0, math.floor(cpus - busy + FREE_MARGIN)))


def measure_busy(cpus: Collection[int], read: Callable[[], CpuTimes] | None = None,
                 sleep: Callable[[float], None] = time.sleep, own_seconds: Callable[[], float] = time.process_time,
                 seconds: float = MEASURE_SECONDS) -> float | None:
    """CPUs' worth of ``cpus`` that other processes kept busy over ``seconds`` (this process' own CPU time
    left out), from two ``/proc/stat`` snapshots; else the 1-minute load average (it lags: a process that
    just started or stopped barely moves it), capped at ``len(cpus)``; None where neither can be read."""
    read = read or read_proc_stat
    try:
        before, own = read(), own_seconds()
        sleep(seconds)
        after, own = read(), own_seconds() - own
    except (OSError, ValueError, IndexError):
        try:
            return min(float(len(cpus)), os.getloadavg()[0])
        except (OSError, AttributeError):
            return None
    return max(0.0, busy_cpus(before, after, cpus) - own / seconds)


def _positive(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


@dataclass(frozen=True)
class ThreadChoice:
    """torch's intra-op threads, and where the number came from (said once per training)."""

    threads: int
    source: Literal["--threads", "OMP_NUM_THREADS", "free CPUs"]
    cpus: int = 0  # the CPUs this process may use (free CPUs)
    busy: int = 0  # of them, held by other work (whole CPUs, :func:`free_cpus`)
    measured: bool = True  # False: neither /proc/stat nor the load average could be read
    sharers: int = 1  # jobs sharing the free CPUs: torchrun processes times concurrent trainings

    def line(self) -> str:
        """e.g. ``torch: 1 thread (2 CPUs, 1 busy with other work; --threads or OMP_NUM_THREADS to choose)``."""
        count = f"torch: {self.threads} thread{'s' if self.threads != 1 else ''}"
        if self.source == "--threads":
            return f"{count} (--threads)"
        if self.source == "OMP_NUM_THREADS":
            return f"{count} (OMP_NUM_THREADS)"
        load = (("none busy" if not self.busy else f"{self.busy} busy with other work") if self.measured
                else "their load unmeasured")
        shared = f", shared by {self.sharers} jobs" if self.sharers > 1 else ""
        return f"{count} ({self.cpus} CPU{'s' if self.cpus != 1 else ''}, {load}{shared}; --threads or OMP_NUM_THREADS to choose)"


def choose_threads(threads: int | None = None, concurrent: int | None = None,
                   busy: Callable[[Collection[int]], float | None] | None = None) -> ThreadChoice:
    """``threads`` if given; else ``OMP_NUM_THREADS`` if set; else the CPUs free of other work (``busy``
    measures it) shared among ``LOCAL_WORLD_SIZE`` torchrun processes and ``concurrent`` trainings
    (default ``UEDP_CONCURRENT_TRAININGS``, else 1): their share, at least 1."""
    if threads is not None:
        return ThreadChoice(threads, "--threads")
    if (env := _positive("OMP_NUM_THREADS")) is not None:
        return ThreadChoice(env, "OMP_NUM_THREADS")
    cpus = _affinity()
    sharers = (_positive("LOCAL_WORLD_SIZE") or 1) * max(1, concurrent or _positive(CONCURRENT_TRAININGS) or 1)
    held = (busy or measure_busy)(cpus)
    free = free_cpus(len(cpus), held or 0.0)
    return ThreadChoice(max(1, free // sharers), "free CPUs", len(cpus), len(cpus) - free, held is not None, sharers)


def default_threads() -> int:
    """``OMP_NUM_THREADS`` if set, else this process' share of the CPUs free of other work."""
    return choose_threads().threads


def use_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads (``threads``, or :func:`default_threads`) and flush denormal floats
    (:func:`flush_denormals`); returns the number of threads set. Call it before the first parallel torch
    operation of a process: threads created later inherit the floating-point mode."""
    return apply_threads(choose_threads(threads) if threads is None else ThreadChoice(threads, "--threads")).threads


def apply_threads(choice: ThreadChoice) -> ThreadChoice:
    """Set torch's intra-op threads to ``choice`` (:func:`choose_threads`), as :func:`use_threads` does."""
    if choice.threads < 1:
        raise ValueError(f"threads must be at least 1, got {choice.threads}")
    flush_denormals()
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    return choice


def flush_denormals() -> bool:
    """CPU arithmetic treats numbers below float32's smallest normal (1.2e-38; float64's 2.2e-308) as 0.

    Noisy weights (every private round adds Gaussian noise to them) drive many activations and gradients
    into that range, where an x86 core computes up to a hundred times slower: on 2 threads a 25M GPT-2's
    userdp round ran at 0.67x of the same round without noise, and at 1.00x with this set
    (``benchmarks/train_throughput.py --mechanisms fedavg,userdp``). No released figure changes by more
    than such a number: clipping bounds and noise are far above it. Set per thread, inherited by threads
    created afterwards (torch's OpenMP workers). Returns False where the CPU cannot (no effect then)."""
    return bool(torch.set_flush_denormal(True))
