"""One DP-SGD clipping step against one noiseless step, on the same GPT-2 and batch: the cost of
per-example clipping alone (no sampling, noise or accounting, which ``train_throughput.py`` includes).

Noiseless: forward, backward, Adam. Private: the clipped per-example gradient sum by ghost clipping
(``auto``: per parameter, Gram-matrix norms or materialised per-layer gradients, whichever is cheaper;
or one of them forced) or by Opacus' per-sample gradients, then Adam. Prints the best of three
repeats of ``--steps`` steps each, and peak memory on CUDA.

    python benchmarks/clipping_step.py [--models gpt2:tiny,gpt2:small] [--batch-size 16] [--length 0]
        [--engines ghost:auto,opacus] [--threads N] [--device auto]

Models as in ``train_throughput.py`` (``gpt2:100m``, ``llama:100m``, ``+loraR``); ``--length N`` makes every
sequence N tokens long (default: CoNLL-like sentences of 20-95 tokens), to see where Gram-matrix norms stop
paying (their cost grows with the square of the length, materialised gradients' linearly).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from uedp.models.batching import collate, encode
from uedp.models.device import resolve_device
from uedp.models.metrics import causal_lm_loss, per_sequence_lm_loss
from uedp.models.threads import use_threads
from uedp.models.tokenization import byte_level_tokenizer
from uedp.privacy.per_sample.ghost import GhostClipping
from uedp.privacy.per_sample.opacus_path import OpacusClipping

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import build  # the model specs, defined once there

ENGINES = ("ghost:auto", "ghost:ghost", "ghost:materialise", "opacus")


def best_seconds(step: Callable[[], None], steps: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(3):
        step()
    best = float("inf")
    for _ in range(3):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / steps)
    return best


def peak(device: torch.device) -> str:
    """Peak GPU memory since the last reset, as a column (empty on CPU)."""
    if device.type != "cuda":
        return ""
    return f"{torch.cuda.max_memory_allocated(device) / 2**20:>12.0f} MiB"


def measure(spec: str, batch: dict[str, torch.Tensor], batch_size: int, steps: int, device: torch.device,
            tokenizer: object, engines: list[str]) -> None:
    """Print the noiseless step and every engine's private step for one model."""
    torch.manual_seed(0)
    model = build(spec, tokenizer).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, 1e-4)

    def noiseless() -> None:
        loss = causal_lm_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()

    base = best_seconds(noiseless, steps, device)
    print(f"{spec:<18}{'noiseless':<20}{base * 1e3:>9.1f}{1.0:>13.2f}x{peak(device)}", flush=True)
    for engine in engines:
        clipping = (OpacusClipping(model) if engine == "opacus"
                    else GhostClipping(model, "mean", engine.split(":")[1]))  # type: ignore[arg-type]

        def private(clipping: GhostClipping | OpacusClipping = clipping) -> None:
            for param, grad in zip(params, clipping.clipped_sum(per_sequence_lm_loss, batch, batch_size, 1.0)):
                param.grad = grad
            optimizer.step()
            optimizer.zero_grad()

        seconds = best_seconds(private, steps, device)
        clipping.close()
        print(f"{spec:<18}{engine:<20}{seconds * 1e3:>9.1f}{base / seconds:>13.2f}x{peak(device)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2:tiny,gpt2:small", help="kind:size[+loraR], comma-separated")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--length", type=int, default=0, help="tokens per sequence (0: CoNLL-like, 20-95)")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    use_threads(args.threads)
    device = resolve_device(args.device)
    tokenizer = byte_level_tokenizer()
    if args.length:  # every sequence exactly that long (bytes are tokens; the tokenizer adds end of text)
        texts = [("the clinic in Leeds called about the tablets on Monday " * (args.length // 50 + 2))[:args.length - 1]
                 for _ in range(args.batch_size)]
    else:  # sentences of 20 to 95 bytes, as in CoNLL-2003 (mean about 57 byte tokens)
        texts = [("the clinic in Leeds called about the tablets on Monday " * 2)[: 20 + (5 * i) % 76]
                 for i in range(args.batch_size)]
    longest = max(args.length, 96)
    batch = {k: v.to(device) for k, v in collate(encode(tokenizer, texts, longest), tokenizer.pad_token_id).items()}
    print(f"{'model':<18}{'engine':<20}{'ms/step':>9}{'vs noiseless':>14}")
    for spec in args.models.split(","):
        measure(spec, batch, args.batch_size, args.steps, device, tokenizer, args.engines.split(","))
    print(f"device: {device} ({torch.get_num_threads()} threads); batch {args.batch_size} x "
          f"{batch['input_ids'].shape[1]} tokens at most; torch {torch.__version__}")


if __name__ == "__main__":
    main()
