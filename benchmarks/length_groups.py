"""Batches of like lengths against one padded batch, on CoNLL-2003's sentences, on the same model in one run.

A batch is padded to its longest example; CoNLL's sentences run from 3 to 64 tokens, so one padded pass
over a Poisson batch computes mostly padding. DP-SGD clips and sums each example on its own and evaluation
sums each sequence's NLL, so both may read the batch in groups of like lengths
(``models.batching.like_length_groups``) and get the same sum. This prints, for each:

* DP-SGD's clipped gradient sum of ``--batches`` random batches of ``--batch-size`` sentences: one padded
  pass against the groups (seconds, the ratio, and the largest difference relative to the sum's norm);
* a noiseless step (the token-mean loss) on ``--batches`` batches of ``--noiseless-batch-size`` sentences:
  one padded pass against the groups, each part weighted by its tokens (seconds and the ratio);
* evaluation of the first ``--eval-sentences`` test sentences: in input order against sorted by length
  (seconds, the ratio, and the two perplexities).

    python benchmarks/length_groups.py --model causal-lm:/tmp/smolhome/bases/smollm2+lora8 --threads 2
    python benchmarks/length_groups.py --model gpt2:small

``--model`` is ``kind:size[+loraR]`` as in ``benchmarks/train_throughput.py``.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_throughput import build, tokenizer_for

from uedp.models.batching import batches, collate, encode, like_length_groups
from uedp.models.metrics import causal_lm_loss, causal_lm_nll, per_sequence_lm_loss, perplexity
from uedp.models.threads import use_threads
from uedp.models.training import like_length_step, optimizer_step
from uedp.privacy.mechanisms.dpsgd import DpSgd
from uedp.privacy.mechanisms.params import DpSgdParams
from uedp.privacy.per_sample import per_sample_clipping
from uedp.privacy.population import Population
from uedp.storage.formats.conll import conll_records

CPU = torch.device("cpu")


def conll_sentences(path: Path) -> list[str]:
    """The sentences of a CoNLL-2003 file, as ingest reads them."""
    return [record.text for record in conll_records(path)]


def timed(repeats: int, run: Callable[[], object]) -> tuple[float, object]:
    seconds, result = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        result = run()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds), result


def perplexity_in_input_order(model: torch.nn.Module, sequences: Sequence[torch.Tensor], pad_id: int) -> float:
    """Evaluation as it was: batches of 32 in the order given."""
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches(sequences, 32, pad_id):
            nll, n = causal_lm_nll(model, batch)
            total, count = total + float(nll), count + n
    return math.exp(total / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2:small", help="kind:size[+loraR] (benchmarks/train_throughput.py)")
    parser.add_argument("--conll-dir", type=Path, default=Path("../shared/data/conll2003"))
    parser.add_argument("--batch-size", type=int, default=64, help="sentences a DP-SGD batch")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--noiseless-batch-size", type=int, default=16, help="sentences a noiseless batch")
    parser.add_argument("--eval-sentences", type=int, default=256)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="the median is shown")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    use_threads(args.threads)

    tokenizer = tokenizer_for(args.model)
    model = build(args.model, tokenizer)
    pad = tokenizer.pad_token_id
    train = encode(tokenizer, conll_sentences(args.conll_dir / "eng.train"), args.max_len)
    test = encode(tokenizer, conll_sentences(args.conll_dir / "eng.testb")[: args.eval_sentences], args.max_len)
    params = [p for p in model.parameters() if p.requires_grad]
    picker = random.Random(0)
    drawn = [picker.sample(train, args.batch_size) for _ in range(args.batches)]
    real = sum(len(e) for batch in drawn for e in batch)
    padded = sum(len(batch) * max(len(e) for e in batch) for batch in drawn)
    grouped = sum(len(g) * max(len(e) for e in g) for batch in drawn for g in like_length_groups(batch))
    print(f"{args.model}: {args.batches} batches of {args.batch_size} CoNLL-2003 sentences, {args.threads} thread(s), "
          f"median of {args.repeats}; real tokens {real}, computed one padded pass {padded}, in groups {grouped}")

    mechanism = DpSgd(DpSgdParams(clip=1.0), Population.declared(len(train)))
    clipping = per_sample_clipping(model)

    def one_pass() -> list[list[torch.Tensor]]:
        return [clipping.clipped_sum(per_sequence_lm_loss, collate(batch, pad), len(batch), 1.0) for batch in drawn]

    def in_groups() -> list[list[torch.Tensor]]:
        return [mechanism.clipped_gradient_sum(clipping, params, batch, per_sequence_lm_loss, CPU, pad)
                for batch in drawn]

    try:
        slow, whole = timed(args.repeats, one_pass)
        fast, parts = timed(args.repeats, in_groups)
    finally:
        clipping.close()
    gap = max(float(torch.linalg.vector_norm(torch.cat([(a - b).flatten() for a, b in zip(x, y)])))
              / max(float(torch.linalg.vector_norm(torch.cat([a.flatten() for a in x]))), 1e-30)
              for x, y in zip(whole, parts))  # type: ignore[call-overload]
    print(f"  DP-SGD clipped sum: one padded pass {slow:6.2f} s, like-length groups {fast:6.2f} s: "
          f"{slow / fast:.2f}x; largest difference {gap:.1e} of the sum's norm")

    small = [picker.sample(train, args.noiseless_batch_size) for _ in range(args.batches)]
    frozen = torch.optim.SGD(params, lr=0.0)  # the same weights for both ways

    def padded_steps() -> None:
        for batch in small:
            optimizer_step(model, frozen, collate(batch, pad), causal_lm_loss, CPU)

    def grouped_steps() -> None:
        for batch in small:
            like_length_step(model, frozen, batch, pad, causal_lm_loss, CPU)

    slow, _ = timed(args.repeats, padded_steps)
    fast, _ = timed(args.repeats, grouped_steps)
    print(f"  noiseless step, batches of {args.noiseless_batch_size}: one padded pass {slow:6.2f} s, like-length "
          f"groups {fast:6.2f} s: {slow / fast:.2f}x")

    model.eval()
    slow, before = timed(args.repeats, lambda: perplexity_in_input_order(model, test, pad))
    fast, after = timed(args.repeats, lambda: perplexity(model, test, pad, CPU))
    print(f"  evaluation of {len(test)} test sentences: input order {slow:6.2f} s, sorted by length {fast:6.2f} s: "
          f"{slow / fast:.2f}x; perplexity {before:.6g} and {after:.6g}")


if __name__ == "__main__":
    main()
