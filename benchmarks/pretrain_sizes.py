"""Which base size pretrains in about an hour: seconds per noiseless step of ``uedp pretrain``'s batch
(32 sentences, the BPE vocabulary of 8192 tokens, sentences of Reuters-21578's length) for the gpt2 and
llama presets, and what ``--steps`` fit in an hour at that rate.

    python benchmarks/pretrain_sizes.py [--sizes tiny,small,base] [--threads 2] [--tokens 40] [--steps 6]

``--tokens``: the padded length of a batch (a batch costs as much as its longest sentence; with
``--max-len 64`` and Reuters' sentences most batches pad to 40-64). The first two steps warm up and are
not timed. The figures are a rate for choosing a size, not the pretraining's wall time, which adds the
evaluations (the valid split before and after, the test split at the end) and checkpoints.
"""

from __future__ import annotations

import argparse
import time

import torch

from uedp.models.causal_lm import build_llama
from uedp.models.gpt2 import build_gpt2
from uedp.models.training import adam

VOCAB = 8192


def seconds_per_step(model: torch.nn.Module, batch: int, tokens: int, steps: int) -> float:
    optimizer = adam(model.parameters(), 1e-3, decoupled=True)
    ids = torch.randint(0, VOCAB, (batch, tokens))
    times = []
    for step in range(steps + 2):
        started = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= 2:
            times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="small,base")
    parser.add_argument("--kinds", default="gpt2,llama")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"batch {args.batch} x {args.tokens} tokens, vocabulary {VOCAB}, {args.threads} torch threads")
    print(f"{'model':<12} {'parameters':>11} {'s/step':>7} {'steps/hour':>10}")
    for kind in args.kinds.split(","):
        for size in args.sizes.split(","):
            torch.manual_seed(0)
            model = build_gpt2(size, VOCAB, 0) if kind == "gpt2" else build_llama(size, VOCAB, 0)
            parameters = sum(p.numel() for p in model.parameters())
            seconds = seconds_per_step(model, args.batch, args.tokens, args.steps)
            print(f"{kind + ':' + size:<12} {parameters / 1e6:>10.1f}M {seconds:>7.2f} {3600 / seconds:>10,.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
