"""Noise calibration: dp_accounting's own search (what uedp ran before) against uedp's grid search, first time
and remembered, in CPU seconds of this process, on the settings of issue 63 (userdp, 946 users, q_user 0.1,
300 rounds, target epsilon 8, with the DP count of users) and a few more. Speed as ratios in one run.

    .venv/bin/python benchmarks/calibration_speed.py
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import dp_accounting

from uedp.privacy.accounting import memo
from uedp.privacy.accounting.calibration import calibrate_noise_multiplier
from uedp.privacy.accounting.events import (
    MIN_NOISE_MULTIPLIER,
    _epsilon_after,
    epsilon_after,
    group_replace_round,
    make_accountant,
    poisson_gaussian_round,
    with_initial,
)

SETTINGS = {
    "userdp q=0.1 300 rounds eps 8 +count": (lambda z: poisson_gaussian_round(0.1, z), 300, 8.0, "add_remove",
                                             dp_accounting.GaussianDpEvent(10.0), MIN_NOISE_MULTIPLIER),
    "dpsgd q=0.01 1000 steps eps 1": (lambda z: poisson_gaussian_round(0.01, z), 1000, 1.0, "add_remove", None,
                                      MIN_NOISE_MULTIPLIER),
    "uedp-bounded g=3 q=0.2 30 rounds eps 8": (lambda z: group_replace_round(0.2, z, 3), 30, 8.0, "replace", None,
                                               MIN_NOISE_MULTIPLIER * math.sqrt(3)),
}


def cpu(work):  # type: ignore[no-untyped-def]
    start = time.process_time()
    value = work()
    return value, time.process_time() - start


def before(event_for, rounds, target, adjacency, initial, floor) -> float:  # type: ignore[no-untyped-def]
    """uedp's calibration before issue 63: dp_accounting's bracket search and Brent's method to 1e-3."""
    _epsilon_after(event_for(floor), rounds, 1e-5, "pld", adjacency, initial, None)  # its check of the floor
    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: make_accountant("pld", adjacency),
        lambda z: with_initial(dp_accounting.SelfComposedDpEvent(event_for(z), rounds), initial), target, 1e-5,
        bracket_interval=dp_accounting.LowerEndpointAndGuess(floor, max(1.0, 2 * floor)), tol=1e-3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-before", action="store_true", help="leave out dp_accounting's own search (slow)")
    args = parser.parse_args()
    os.environ[memo.CACHE_ENV] = tempfile.mkdtemp(prefix="uedp-calibration-bench-")
    print(f"{'setting':40s} {'before z':>9s} {'cpu':>6s} | {'grid z':>9s} {'epsilon':>9s} {'cpu':>6s} "
          f"{'ratio':>6s} | {'remembered cpu':>14s}")
    for name, setting in SETTINGS.items():
        print(row(name, *setting, skip_before=args.skip_before), flush=True)


def row(name, event_for, rounds, target, adjacency, initial, floor, skip_before: bool) -> str:  # type: ignore[no-untyped-def]
    grid = functools.partial(calibrate_noise_multiplier, event_for, rounds, target, 1e-5, "pld", adjacency, initial,
                             floor)
    memo.forget()
    old_z, old_cpu = (math.nan, math.nan) if skip_before else cpu(
        functools.partial(before, event_for, rounds, target, adjacency, initial, floor))
    memo.forget()
    z, new_cpu = cpu(grid)
    epsilon = epsilon_after(event_for(z), rounds, 1e-5, "pld", adjacency, initial)
    memo.forget()  # the next process: read from the shared folder
    _, cached_cpu = cpu(grid)
    return (f"{name:40s} {old_z:9.6f} {old_cpu:6.2f} | {z:9.6f} {epsilon:9.6f} {new_cpu:6.2f} "
            f"{old_cpu / new_cpu:5.1f}x | {cached_cpu:14.4f}")

if __name__ == "__main__":
    main()
