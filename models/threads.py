"""How many threads torch may use for one operation (intra-op parallelism).

torch's own default is the machine's core count, whatever share of it this process may use: two jobs
on one 2-core machine then run four threads on two cores, and each step waits for a descheduled
thread (``benchmarks/threads_under_load.py``: a tiny GPT-2 step went from 11.5 ms to 175 ms with one
other busy process). uedp uses, in order: the ``--threads`` a user gives; ``OMP_NUM_THREADS`` when set
(the user already chose); else the CPUs in this process' affinity mask (``taskset``, cgroup cpusets),
divided among the torchrun processes on this machine (``LOCAL_WORLD_SIZE``).
"""

from __future__ import annotations

import os

import torch


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this platform (macOS)
        return os.cpu_count() or 1


def default_threads() -> int:
    """``OMP_NUM_THREADS`` if set, else this process' share of the CPUs it may use."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, available_cpus() // max(1, processes))


def use_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads (``threads``, or :func:`default_threads`) and flush denormal floats
    (:func:`flush_denormals`); returns the number of threads set. Call it before the first parallel torch
    operation of a process: threads created later inherit the floating-point mode."""
    count = threads if threads is not None else default_threads()
    if count < 1:
        raise ValueError(f"threads must be at least 1, got {count}")
    flush_denormals()
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count


def flush_denormals() -> bool:
    """CPU arithmetic treats numbers below float32's smallest normal (1.2e-38; float64's 2.2e-308) as 0.

    Noisy weights (every private round adds Gaussian noise to them) drive many activations and gradients
    into that range, where an x86 core computes up to a hundred times slower: on 2 threads a 25M GPT-2's
    userdp round ran at 0.67x of the same round without noise, and at 1.00x with this set
    (``benchmarks/train_throughput.py --mechanisms fedavg,userdp``). No released figure changes by more
    than such a number: clipping bounds and noise are far above it. Set per thread, inherited by threads
    created afterwards (torch's OpenMP workers). Returns False where the CPU cannot (no effect then)."""
    return bool(torch.set_flush_denormal(True))
