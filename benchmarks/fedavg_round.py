"""One DP-FedAvg round (userdp/uedp local updates): uedp's reused worker model, and its users
vectorized with torch.func.vmap, against the UeDP reference code's pattern, a deep copy of the model
(and a fresh optimizer) per user.

Same users, same data, same batches in the same order, same GPT-2 config; the clipped sums must agree
within float tolerance. Prints the median of several repeats.

    python benchmarks/fedavg_round.py [--users 16] [--local-steps 5] [--preset tiny|small] [--repeats 5]
    python benchmarks/fedavg_round.py --conll ../shared/data/conll2003/eng.train [--q-user 0.05]

With ``--conll``, the round is CoNLL-2003's: every document is a user (946 in eng.train), each sampled
with probability ``--q-user`` (about 47 at 0.05), its sentences encoded as training encodes them.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch

from uedp.models.batching import encode
from uedp.models.device import resolve_device
from uedp.models.gpt2 import build_gpt2
from uedp.models.metrics import causal_lm_loss
from uedp.models.threads import use_threads
from uedp.models.tokenization import byte_level_tokenizer
from uedp.privacy.mechanisms.fedavg import LocalTrainer
from uedp.privacy.mechanisms.vectorized import VectorizedLocalTrainer
from uedp.privacy.primitives import flatten
from uedp.storage.formats.conll import conll_records


class DeepCopyPerUser(LocalTrainer):
    """The reference code's pattern: every user gets ``copy.deepcopy(model)`` and a new optimizer."""

    def __init__(self, model: torch.nn.Module, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(model, *args, **kwargs)
        self.template = model

    def local_delta(self, theta: torch.Tensor, sequences: list[torch.Tensor], stream: torch.Generator) -> torch.Tensor:
        self.worker = copy.deepcopy(self.template)
        self.worker.train()
        self.params = [p for p in self.worker.parameters() if p.requires_grad]
        return super().local_delta(theta, sequences, stream)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--sentences-per-user", type=int, default=12)
    parser.add_argument("--local-steps", type=int, default=5)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--conll", type=Path, default=None, help="a CoNLL-2003 file: its documents are the users")
    parser.add_argument("--q-user", type=float, default=0.05, help="with --conll: each user's sampling probability")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: uedp's default)")
    args = parser.parse_args()
    use_threads(args.threads)
    device = resolve_device(args.device)
    tokenizer = byte_level_tokenizer()
    torch.manual_seed(0)
    model = build_gpt2(args.preset, len(tokenizer), tokenizer.eos_token_id).to(device)
    if args.conll is not None:
        documents: dict[str, list[str]] = {}
        for record in conll_records(args.conll):
            documents.setdefault(record.user, []).append(record.text)
        sampled = (torch.rand(len(documents), generator=torch.Generator().manual_seed(0)) < args.q_user).tolist()
        users = [encode(tokenizer, texts, 96) for keep, texts in zip(sampled, documents.values()) if keep]
        print(f"{args.conll.name}: {len(documents)} users, {len(users)} sampled at q_u = {args.q_user}")
        args.users = len(users)
    else:
        users = [encode(tokenizer, [f"user {u} note {i}: the clinic in Leeds called about the tablets"
                                    for i in range(args.sentences_per_user)], 64) for u in range(args.users)]
    theta = flatten([p for p in model.parameters() if p.requires_grad])
    results, times = {}, {}
    contenders = (("deep copy per user (reference code)", DeepCopyPerUser), ("uedp: one reused worker", LocalTrainer),
                  ("uedp: users vectorized (vmap)", VectorizedLocalTrainer))
    for name, cls in contenders:
        runs = []
        for _ in range(args.repeats):
            trainer = cls(model, causal_lm_loss, device, tokenizer.pad_token_id, 1.0, args.local_steps, 8, 0.5)
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            streams = [torch.Generator().manual_seed(u) for u in range(len(users))]  # one per user, as in training
            results[name] = trainer.clipped_sum(theta, users, [1.0] * len(users), streams)
            if device.type == "cuda":
                torch.cuda.synchronize()
            runs.append(time.perf_counter() - start)
        times[name] = statistics.median(runs)
    baseline = next(iter(times))
    equal = all(torch.allclose(results[baseline], r, rtol=1e-4, atol=1e-6) for r in results.values())
    params = sum(p.numel() for p in model.parameters())
    print(f"{'what':<40}{'users':>6}{'K':>4}{'params':>12}{'s/round':>10}{'ratio':>8}")
    for name in times:
        print(f"{name:<40}{args.users:>6}{args.local_steps:>4}{params:>12,}{times[name]:>10.3f}"
              f"{times[baseline] / times[name]:>8.2f}")
    print(f"equal clipped sums (rtol 1e-4): {equal}; device: {device} ({torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
