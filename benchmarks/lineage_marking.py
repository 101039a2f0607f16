"""What marking a logged model with its lineage adds (services.lineage.mark_logged_model): the content hash
of the saved model's files, beside the save itself, on real GPT-2s of each size.

    python benchmarks/lineage_marking.py [--models gpt2:tiny,gpt2:25m,gpt2:100m] [--repeats 3]

Prints the saved size, seconds to save (``models.saving.save_model``) and to hash (median of the repeats),
and the hash as a share of the save. Logging then copies the same files into MLflow's artifact store.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from train_throughput import build  # the benchmarks' one model builder (this folder)

from uedp.models.checkpoints import content_hash
from uedp.models.saving import save_model
from uedp.models.tokenization import byte_level_tokenizer


def median_seconds(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2:tiny,gpt2:25m,gpt2:100m")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = byte_level_tokenizer()
    print(f"{'model':<12} {'MiB':>8} {'save s':>8} {'hash s':>8} {'hash/save':>10}")
    for name in args.models.split(","):
        model = build(name, tokenizer)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            save = median_seconds(partial(save_model, model, tokenizer, folder), args.repeats)
            digest = median_seconds(partial(content_hash, folder), args.repeats)
            mib = sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 2**20
        print(f"{name:<12} {mib:>8.1f} {save:>8.2f} {digest:>8.2f} {digest / save:>9.2f}x")


if __name__ == "__main__":
    main()
