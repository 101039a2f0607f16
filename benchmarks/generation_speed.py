"""Generation speed: ``uedp generate``'s sampling with the key/value cache against the loop it replaced
(the whole prefix read again at every token), on the same model, prompts, settings and device.

Both loops draw the same number of tokens: every text runs to ``--new-tokens`` (the end-of-text token is
never drawn: its logit is pushed down), so tokens/s compare the loops and not what they happened to sample.
The old loop needs prompts of one length per batch; both get the same batches here (``--prompt-tokens``
each). The two are interleaved ``--repeats`` times (A B A B ...) and the table shows medians, so the load
of a shared machine falls on both alike.

    python benchmarks/generation_speed.py [--models gpt2:small,FOLDER] [--texts 32] [--batch-size 16]
        [--prompt-tokens 4] [--new-tokens 48] [--repeats 3] [--threads 2]

A model is a preset (``gpt2:small``, ``llama:tiny``) with the byte-level vocabulary, or a checkpoint folder
(SmolLM2 as ``uedp base smollm2`` writes it: ``.uedp/bases/smollm2``) with its own tokenizer.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from uedp.models.sampling import SamplingSettings, _continue_cached, _continue_whole_prefix


def load(spec: str) -> tuple[Any, int, int]:
    """The model, its vocabulary size and its EOS id."""
    from uedp.models.factory import build_model
    from uedp.models.tokenization import byte_level_tokenizer, load_tokenizer

    if Path(spec).expanduser().is_dir():
        from uedp.models.causal_lm import load_causal_lm

        tokenizer = load_tokenizer(Path(spec).expanduser())
        return load_causal_lm(Path(spec).expanduser()), len(tokenizer), int(tokenizer.eos_token_id)
    kind, _, size = spec.partition(":")
    tokenizer = byte_level_tokenizer()
    torch.manual_seed(0)
    return build_model(kind, size, tokenizer), len(tokenizer), int(tokenizer.eos_token_id)  # type: ignore[arg-type]


class NoEnd(torch.nn.Module):
    """The model with its end-of-text logit pushed down: every text runs to the token limit."""

    def __init__(self, model: Any, eos: int):
        super().__init__()
        self.model, self.eos, self.config = model, eos, model.config

    def forward(self, **kwargs: Any) -> Any:
        output = self.model(**kwargs)
        output.logits[..., self.eos] = -1e9
        return output


def timed(loop: Any, model: Any, batches: list[list[list[int]]], eos: int, settings: SamplingSettings) -> float:
    """Tokens per second of ``loop`` over ``batches``."""
    started = time.perf_counter()
    tokens = 0
    with torch.no_grad():
        for batch in batches:
            rows = loop(model, batch, eos, settings, torch.Generator().manual_seed(0))
            tokens += sum(len(r) for r in rows)
    return tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2:tiny,gpt2:small")
    parser.add_argument("--texts", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = SamplingSettings(max_new_tokens=args.new_tokens)
    print(f"{args.texts} texts of {args.prompt_tokens} prompt + {args.new_tokens} new tokens, batch {args.batch_size}, "
          f"{args.threads} thread(s), {args.repeats} interleaved repeats, medians")
    print("| model | parameters | whole prefix, tokens/s | key/value cache, tokens/s | speed-up |")
    print("|---|---:|---:|---:|---:|")
    for spec in args.models.split(","):
        model, vocabulary, eos = load(spec)
        model.eval()
        wrapped = NoEnd(model, eos)
        generator = torch.Generator().manual_seed(1)
        ids = torch.randint(0, vocabulary, (args.texts, args.prompt_tokens), generator=generator)
        ids[ids == eos] = (eos + 1) % vocabulary
        rows = ids.tolist()
        batches = [rows[i:i + args.batch_size] for i in range(0, len(rows), args.batch_size)]
        old, new = [], []
        for _ in range(args.repeats):
            old.append(timed(_continue_whole_prefix, wrapped, batches, eos, settings))
            new.append(timed(_continue_cached, wrapped, batches, eos, settings))
        parameters = sum(p.numel() for p in model.parameters())
        print(f"| {Path(spec).name if ':' not in spec else spec} | {parameters / 1e6:.1f}M | {statistics.median(old):.0f} "
              f"| {statistics.median(new):.0f} | {statistics.median(new) / statistics.median(old):.1f}x |", flush=True)


if __name__ == "__main__":
    main()
