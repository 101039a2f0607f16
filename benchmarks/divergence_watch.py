"""What the divergence stop adds to every round: the weights' norm the round loop reads after each round
(``privacy.mechanisms.divergence.weight_norm``), on the weights of a real GPT-2 of each size, beside the
same norm taken with a float64 copy of every weight (how it was first written).

    python benchmarks/divergence_watch.py [--models gpt2:25m,gpt2:100m] [--threads 2] [--repeats 5]

Prints seconds per round (median of the repeats); read them against a step's time from
``train_throughput.py`` on the same machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from uedp.models.threads import use_threads
from uedp.privacy.mechanisms.divergence import weight_norm


def float64_norm(params: list[torch.Tensor]) -> float:
    return float(torch.linalg.vector_norm(torch.stack([p.detach().norm(dtype=torch.float64) for p in params])))


def seconds(norm, params: list[torch.Tensor], repeats: int) -> float:  # type: ignore[no-untyped-def]
    norm(params)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        norm(params)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2:25m,gpt2:100m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    use_threads(args.threads)
    from train_throughput import build  # the benchmarks' one model builder (this folder)

    from uedp.models.tokenization import byte_level_tokenizer

    tokenizer = byte_level_tokenizer()

    print("| model | weights | weight_norm s/round | float64 copy s/round |\n|---|---:|---:|---:|")
    for name in args.models.split(","):
        params = [p for p in build(name, tokenizer).parameters() if p.requires_grad]
        count = sum(p.numel() for p in params)
        print(f"| {name} | {count / 1e6:.1f}M | {seconds(weight_norm, params, args.repeats):.4f} | "
              f"{seconds(float64_norm, params, args.repeats):.4f} |", flush=True)


if __name__ == "__main__":
    main()
