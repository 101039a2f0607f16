"""Scoring a canary's candidates, read whole against their shared prefix read once (the key/value cache), on
the same model in one run: seconds for ``--candidates`` phone candidates ("Call me on 555-NNNN ."), the
ratio, and the largest difference in summed NLL between the two.

The canary attack scores every candidate of a small format exactly (10^4 for a phone number) and 4,000 of
a large one; at 135M parameters that is tens of minutes a model on a CPU, once per attacked run.

    python benchmarks/canary_scoring.py --model causal-lm:/tmp/smolhome/bases/smollm2+lora8 --threads 1
    python benchmarks/canary_scoring.py --model gpt2:small --candidates 2000

``--model`` is ``kind:size[+loraR]`` as in ``benchmarks/train_throughput.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_throughput import build, tokenizer_for

from uedp.models.batching import encode
from uedp.models.metrics import common_prefix_length, sequence_nll, sequence_nll_shared_prefix
from uedp.models.threads import use_threads
from uedp.privacy.attacks.canaries import canary_format


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2:small", help="kind:size[+loraR] (benchmarks/train_throughput.py)")
    parser.add_argument("--candidates", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=256, help="as the attack scores them")
    parser.add_argument("--repeats", type=int, default=3, help="alternating the two ways; the median is shown")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    use_threads(args.threads)

    tokenizer = tokenizer_for(args.model)
    model = build(args.model, tokenizer).eval()
    phone = canary_format("phone")
    step = max(1, phone.size // args.candidates)
    texts = [phone.template.format(secret=phone.secret_at(i)) for i in range(0, phone.size, step)][: args.candidates]
    sequences = encode(tokenizer, texts, 96)
    shared = common_prefix_length(sequences)
    device = torch.device("cpu")
    ways = {"whole": sequence_nll, "shared prefix": sequence_nll_shared_prefix}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    scores: dict[str, torch.Tensor] = {}
    for _ in range(args.repeats):
        for name, score in ways.items():
            began = time.perf_counter()
            scores[name] = score(model, sequences, tokenizer.pad_token_id, device, args.batch_size)
            seconds[name].append(time.perf_counter() - began)
    tokens = sum(len(s) for s in sequences)
    print(f"{args.model}: {len(sequences)} candidates, {tokens} tokens, {shared} shared by all; "
          f"{args.threads} thread(s), median of {args.repeats}")
    base = statistics.median(seconds["whole"])
    for name, values in seconds.items():
        median = statistics.median(values)
        print(f"  {name:>13}: {median:7.2f} s ({len(sequences) / median:7.1f} candidates/s), {base / median:.2f}x")
    gap = float((scores["whole"][:, 0] - scores["shared prefix"][:, 0]).abs().max())
    print(f"  largest difference in summed NLL: {gap:.2e} nats")


if __name__ == "__main__":
    main()
