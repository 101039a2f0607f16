"""Speed of the local-DP sanitizers on a GloVe-sized vocabulary (random vectors: speed does not depend
on what they mean): the vectorized K-NN table, each CusText mapping, and sampling throughput of CusText
and SanText.

    python benchmarks/sanitize_speed.py [--vocab 50000] [--dim 300] [--k 50] [--tokens 200000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from uedp.privacy.sanitization.embeddings import Embeddings
from uedp.privacy.sanitization.mapping import build_mapping, nearest
from uedp.privacy.sanitization.mechanisms import CusText, SanText, privatize


def timed(label: str, fn):
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    print(f"| {label} | {seconds:.2f} |", flush=True)
    return out, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=300)
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--conservative-vocab", type=int, default=10_000,
                        help="conservative mapping is sequential over shrinking sets: measured on this many tokens")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    emb = Embeddings([f"w{i}" for i in range(args.vocab)], rng.normal(size=(args.vocab, args.dim)).astype(np.float32))
    print(f"vocabulary {args.vocab} x {args.dim}, K = {args.k}, {torch.get_num_threads()} threads\n")
    print("| step | seconds |\n|---|---:|")
    timed(f"K-NN table ({args.vocab} x {args.k}, chunked top-k)", lambda: nearest(emb.vectors, args.k, "euclidean"))
    balanced, _ = timed("balanced mapping (K-NN table + assignment)", lambda: build_mapping(emb, args.k, "balanced"))
    small = Embeddings(emb.tokens[:args.conservative_vocab], emb.vectors[:args.conservative_vocab])
    timed(f"conservative mapping ({args.conservative_vocab} tokens)", lambda: build_mapping(small, args.k, "conservative"))
    records = [rng.integers(0, args.vocab, size=25) for _ in range(args.tokens // 25)]
    _, seconds = timed(f"CusText, {args.tokens} tokens, token strategy",
                       lambda: privatize(records, CusText(emb, balanced, 1.0), torch.Generator().manual_seed(0)))
    print(f"\nCusText: {args.tokens / seconds:,.0f} tokens/s")
    few = records[: max(1, 20_000 // 25)]
    _, seconds = timed("SanText, 20000 tokens (full-vocabulary rows)",
                       lambda: privatize(few, SanText(emb, 1.0), torch.Generator().manual_seed(0)))
    print(f"SanText: {20_000 / seconds:,.0f} tokens/s")


if __name__ == "__main__":
    main()
