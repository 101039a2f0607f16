"""Ingest memory and throughput: 1M+ sentences built by repeating the real CoNLL-2003 training file.

Claim (issue 3): memory stays bounded for large inputs. Prints peak RSS over the baseline and
sentences per second, for the given size and for a 10x smaller one, so the two can be compared.

    python benchmarks/ingest_scale.py [--conll ../shared/data/conll2003/eng.train] [--sentences 1000000]

Each size runs in a fresh process, so its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def measure(conll: Path, sentences: int, workdir: Path) -> dict[str, float]:
    """Build the repeated file, ingest it in this process, return figures."""
    from uedp.storage.formats.conll import read_conll
    from uedp.storage.home import DataHome
    from uedp.storage.ingest import IngestOptions, ingest

    per_copy = sum(1 for _ in read_conll(conll))
    copies = -(-sentences // per_copy)
    big = workdir / f"repeated.{copies}x.conll"  # a name without a split: assigned by user
    text = conll.read_bytes()
    with open(big, "wb") as out:
        for _ in range(copies):
            out.write(text)
            out.write(b"\n")
    baseline = _rss_mib()
    start = time.perf_counter()
    result = ingest(DataHome.from_env(workdir / "home"), "bench", [big], IngestOptions(format="conll2003"))
    seconds = time.perf_counter() - start
    return {"sentences": result.sentences, "users": result.users, "seconds": seconds,
            "per_second": result.sentences / seconds, "input_mib": big.stat().st_size / 2**20,
            "baseline_rss_mib": baseline, "peak_rss_mib": _rss_mib()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conll", type=Path, default=REPO.parent / "shared/data/conll2003/eng.train")
    parser.add_argument("--sentences", type=int, default=1_000_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(args.conll, args.sentences, Path(tmp))))
        return
    rows = []
    for size in (args.sentences // 10, args.sentences):
        out = subprocess.run([sys.executable, __file__, "--child", "--conll", str(args.conll), "--sentences", str(size)],
                             check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"{'what':<34}{'sentences':>11}{'users':>8}{'input MiB':>11}{'s':>8}{'sent/s':>10}{'peak RSS MiB':>14}{'over baseline':>15}")
    for r in rows:
        print(f"{'ingest conll2003, repeated':<34}{r['sentences']:>11,}{r['users']:>8,}{r['input_mib']:>11.0f}"
              f"{r['seconds']:>8.1f}{r['per_second']:>10,.0f}{r['peak_rss_mib']:>14.0f}{r['peak_rss_mib'] - r['baseline_rss_mib']:>15.0f}")
    small, large = rows
    print(f"input grew {large['sentences'] / small['sentences']:.1f}x; peak RSS over baseline grew "
          f"{(large['peak_rss_mib'] - large['baseline_rss_mib']) / max(small['peak_rss_mib'] - small['baseline_rss_mib'], 1):.2f}x "
          "(device: CPU)")


if __name__ == "__main__":
    main()
