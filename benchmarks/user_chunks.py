"""A user's text as sentences or as chunks (``--user-text``): how much of each user update is text, and the
text a round reads per second, on CoNLL-2003's writers (one per document), in one run.

A user-level update (here user-level DP-SGD, ``--local-update gradient``: one batch per sampled user) reads
``--local-batch-size`` sequences. CoNLL's sentences are short and uneven, so a batch of them pads up to its
longest sentence (a step splits a batch into groups of like lengths where that saves enough:
``models.training.step_groups``); chunks of a writer's consecutive sentences, up to ``--max-len`` tokens, fill
it. Both trainers draw their batches from the same per-user streams; only the sequences differ.

    python benchmarks/user_chunks.py --conll ../shared/data/conll2003/eng.train [--model gpt2:small]
    python benchmarks/user_chunks.py --conll ... --model causal-lm:/tmp/smolhome/bases/smollm2+lora8 --q-user 0.01

``--model`` is ``kind:size[+loraR]`` as in ``benchmarks/train_throughput.py`` (a preset, or ``causal-lm:FOLDER``
with the folder's own tokenizer). Prints, per mode: text tokens and padded tokens an update computes, seconds a
round (median of ``--repeats``, the modes interleaved), text tokens a second, and the ratio to sentences.
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

from uedp.models.batching import encode, example_length, padded_tokens
from uedp.models.metrics import causal_lm_loss
from uedp.models.threads import use_threads
from uedp.models.training import step_groups
from uedp.privacy.mechanisms.fedavg import LocalTrainer
from uedp.privacy.primitives import flatten
from uedp.storage.formats.conll import conll_records

MODES = ("sentences", "chunks")


def writers(conll: Path) -> list[list[str]]:
    documents: dict[str, list[str]] = {}
    for record in conll_records(conll):
        documents.setdefault(record.user, []).append(record.text)
    return list(documents.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conll", type=Path, required=True, help="a CoNLL-2003 file: its documents are the writers")
    parser.add_argument("--model", default="gpt2:small", help="kind:size[+loraR] (benchmarks/train_throughput.py)")
    parser.add_argument("--q-user", type=float, default=0.05, help="each writer's sampling probability in the round")
    parser.add_argument("--local-batch-size", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    use_threads(args.threads)
    tokenizer = tokenizer_for(args.model)
    model = build(args.model, tokenizer)
    everyone = writers(args.conll)
    sampled = (torch.rand(len(everyone), generator=torch.Generator().manual_seed(0)) < args.q_user).tolist()
    users = [encode(tokenizer, texts, args.max_len) for keep, texts in zip(sampled, everyone) if keep]
    theta = flatten([p for p in model.parameters() if p.requires_grad]).detach()
    trainers = {mode: LocalTrainer(model, causal_lm_loss, torch.device("cpu"), tokenizer.pad_token_id, 1.0, 1,
                                   args.local_batch_size, 1.0, chunk_tokens=args.max_len if mode == "chunks" else 0)
                for mode in MODES}

    def streams() -> list[torch.Generator]:
        return [torch.Generator().manual_seed(u) for u in range(len(users))]

    read: dict[str, tuple[int, int]] = {}
    for mode, trainer in trainers.items():  # what one update reads: its first batch, drawn as training draws it
        batches = [next(trainer._cycle(user, stream)) for user, stream in zip(users, streams())]
        read[mode] = (sum(example_length(e) for b in batches for e in b),  # text, and what the step computes
                      sum(padded_tokens(step_groups(b, causal_lm_loss)) for b in batches))
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.repeats):
        for mode, trainer in trainers.items():  # interleaved: the machine's noise falls on both alike
            start = time.perf_counter()
            trainer.clipped_sum(theta, users, [1.0] * len(users), streams())
            seconds[mode].append(time.perf_counter() - start)
    print(f"{args.conll.name}: {len(everyone)} writers, {len(users)} sampled at q_user {args.q_user}; {args.model}, "
          f"batch {args.local_batch_size}, max_len {args.max_len}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats}")
    print(f"{'user text':<12}{'text tok/update':>17}{'padded tok/update':>19}{'text share':>12}{'s/round':>10}"
          f"{'text tok/s':>12}{'ratio':>8}")
    rates = {}
    for mode in MODES:
        text, padded = read[mode]
        median = statistics.median(seconds[mode])
        rates[mode] = text / median
        print(f"{mode:<12}{text / len(users):>17.1f}{padded / len(users):>19.1f}{text / padded:>12.0%}{median:>10.2f}"
              f"{rates[mode]:>12.0f}{rates[mode] / rates['sentences']:>8.2f}")


if __name__ == "__main__":
    main()
