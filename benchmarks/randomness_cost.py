"""What secret randomness costs per round (PRIVACY.md rule 5), measured side by side in one run.

* Per-unit Poisson coins: one keyed BLAKE2b per unit and round (``Randomness.poisson_sample``), for
  CoNLL-2003-sized unit sets (946 users; 14,041 sequences), against one ``torch.rand(n)`` draw from a
  seeded generator (what the old, insecure code did).
* Gaussian noise: numpy PCG64DXSM seeded from a 256-bit keyed digest (``gaussian_noise`` with a secret
  stream), against ``torch.randn`` from a seeded torch CPU generator (32-bit seeds: not secret), for a
  tiny GPT-2's and GPT-2 small's parameter counts.

    OMP_NUM_THREADS=1 python benchmarks/randomness_cost.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from uedp.privacy.primitives import gaussian_noise
from uedp.privacy.randomness import Randomness


def median_seconds(work: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    randomness = Randomness.secure()
    print(f"{'what':<44} {'secure (s)':>11} {'seeded torch (s)':>17} {'ratio':>7}")
    for label, n in (("Poisson coins, 946 users", 946), ("Poisson coins, 14,041 sequences", 14_041)):
        units = [f"u{i}" for i in range(n)]
        secure = median_seconds(lambda units=units: randomness.poisson_sample("sample", 1, units, 0.05), args.repeats)
        seeded = median_seconds(lambda n=n: (torch.rand(n, generator=torch.Generator().manual_seed(1)) < 0.05).nonzero(),
                                args.repeats)
        print(f"{label:<44} {secure:>11.4f} {seeded:>17.4f} {secure / seeded:>7.1f}")
    for label, n in (("noise, tiny GPT-2 (124,736 parameters)", 124_736), ("noise, GPT-2 small (124M parameters)", 124_000_000)):
        secure = median_seconds(lambda n=n: gaussian_noise((n,), 1.0, randomness.stream("noise", 1)), args.repeats)
        seeded = median_seconds(lambda n=n: gaussian_noise((n,), 1.0, torch.Generator().manual_seed(1)), args.repeats)
        print(f"{label:<44} {secure:>11.4f} {seeded:>17.4f} {secure / seeded:>7.1f}")


if __name__ == "__main__":
    main()
