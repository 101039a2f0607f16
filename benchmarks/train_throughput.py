"""Training throughput of every mechanism against noiseless training: tokens per second on the same
model, data and device (the bundled demo corpus, gold entities), as a cost-versus-size table.

A token counts when a training forward and backward pass consumes it, whichever mechanism runs that
pass (DP-FedAvg's local steps, DP-SGD's per-example pass, selective's two phases), counted by wrapping
the loss function. Tokens/s are timed from the first round of ``Mechanism.train`` to its end: what a
run's length scales. What ``train`` does once before its first round (the accounting plan: the budget
stop and the epsilons a run logs; uedp-bounded's holder choice) is the ``setup s`` column. Data
preparation and noise calibration are outside both.

On a shared machine the load moves while a benchmark runs, so one measurement of each mechanism, one
after another, lets the load decide the ratio. Here the mechanisms of a model are **interleaved** (A B C
A B C ...) for ``--repeats`` rounds, and the table shows each one's **median** tokens/s, the spread
(lowest-highest) and the ratio of medians to noiseless. Peak memory beside it: CUDA's peak allocation on a
GPU; on CPU the peak growth of the process' resident memory during the run (sampled every 10 ms).

    python benchmarks/train_throughput.py [--models gpt2:tiny,gpt2:small,llama:small+lora8] [--steps 20]
        [--rounds 2] [--repeats 3] [--threads N] [--device auto] [--mechanisms noiseless,dpsgd,...]

A model is ``kind:size``: a preset (``gpt2:small``, ``llama:tiny``), a benchmark size built from a config
(``gpt2:25m``, ``gpt2:100m``, ``llama:25m``, ``llama:100m``: random weights are enough for throughput), or
a checkpoint folder (``causal-lm:FOLDER``); ``+loraR`` adds LoRA adapters of rank R (only they train).
``dpsgd:opacus`` / ``dpsgd:exact`` pick the per-example engine; ``@bf16`` runs a mechanism with ``--precision
bf16`` (``noiseless@bf16``: beside noiseless, the ratio is bf16's speed-up). ``fedavg`` is userdp's rounds with its
clipping and noise switched off (a benchmark-only baseline): userdp and uedp-bounded are compared with it
when it is measured (what their privacy costs per round), step-based mechanisms with noiseless. Aims (issue
35): dpsgd >= 0.8x noiseless, LoRA >= 0.9x, userdp and uedp-bounded >= 0.95x noiseless FedAvg.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

MECHANISMS = ("noiseless", "dpsgd", "selective", "fedavg", "userdp", "uedp-bounded")
ROUND_BASED = ("userdp", "uedp-bounded")  # compared with fedavg when it is measured

# Sizes built here from a config, so a cost-versus-size table needs no download (byte vocabulary: 257 ids).
BENCHMARK_SIZES: dict[str, dict[str, dict[str, int]]] = {
    "gpt2": {"25m": {"n_layer": 6, "n_head": 8, "n_embd": 576, "n_positions": 256},
             "100m": {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 256}},
    "llama": {"25m": {"num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4, "hidden_size": 576,
                      "intermediate_size": 1536, "max_position_embeddings": 256},
              "100m": {"num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 4,
                       "hidden_size": 768, "intermediate_size": 2048, "max_position_embeddings": 256}},
}


@dataclass
class Measured:
    """Every repeat of one (model, mechanism)."""

    work: str = ""
    tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    setup: list[float] = field(default_factory=list)
    peak_mib: list[float] = field(default_factory=list)

    @property
    def rates(self) -> list[float]:
        return [t / s for t, s in zip(self.tokens, self.seconds)]


class PeakMemory:
    """Peak memory of a block: CUDA's peak allocation, or on CPU the peak growth of resident memory."""

    def __init__(self, device: Any):
        self.device = device
        self.peak = 0

    def __enter__(self) -> PeakMemory:
        import torch

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        import psutil

        process = psutil.Process()
        self.start = process.memory_info().rss
        self.running = True

        def sample() -> None:
            while self.running:
                self.peak = max(self.peak, process.memory_info().rss - self.start)
                time.sleep(0.01)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self.running = False
            self.thread.join()

    @property
    def mib(self) -> float:
        return self.peak / 2**20


def parse(spec: str) -> tuple[str, str, int]:
    """``kind:size[+loraR]`` -> (kind, size, LoRA rank or 0)."""
    kind, _, sized = spec.partition(":")
    size, _, lora = sized.partition("+lora")
    return kind, size, int(lora or 0)


def config_size(kind: str, size: str) -> str:
    """What the run's configuration names (a benchmark size is built here, so the config sees a preset)."""
    return "tiny" if size in BENCHMARK_SIZES.get(kind, {}) else size


def tokenizer_for(spec: str) -> Any:
    """The tokenizer a ``kind:size[+loraR]`` model reads: a folder's own for ``causal-lm:FOLDER``, else bytes."""
    from uedp.models.tokenization import byte_level_tokenizer, load_tokenizer

    kind, size, _ = parse(spec)
    return load_tokenizer(size) if kind == "causal-lm" else byte_level_tokenizer()


def build(spec: str, tokenizer: Any) -> Any:
    """The model of ``kind:size[+loraR]``: a preset, a benchmark size or a folder, seeded alike every time."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from uedp.models.factory import build_model
    from uedp.models.lora import LoraSettings, with_lora

    kind, size, lora = parse(spec)
    torch.manual_seed(0)
    if size in BENCHMARK_SIZES.get(kind, {}):
        ids = {"vocab_size": len(tokenizer), "bos_token_id": tokenizer.eos_token_id,
               "eos_token_id": tokenizer.eos_token_id}
        model = (GPT2LMHeadModel(GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                            **BENCHMARK_SIZES[kind][size], **ids)) if kind == "gpt2" else
                 LlamaForCausalLM(LlamaConfig(attention_dropout=0.0, **BENCHMARK_SIZES[kind][size], **ids)))
    else:
        model = build_model(kind, size, tokenizer)  # type: ignore[arg-type]
    return with_lora(model, LoraSettings(lora, 2.0 * lora)) if lora else model


def demo_home(root: Path) -> Any:
    """A data home under ``root`` with the bundled demo corpus and its gold entities."""
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.services.detect import detect_entities
    from uedp.storage.home import DataHome
    from uedp.storage.ingest import IngestOptions, ingest

    home = DataHome.from_env(root / "home")
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    return home


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2:tiny,gpt2:small,llama:small,llama:small+lora8",
                        help="kind:size[+loraR], comma-separated")
    parser.add_argument("--steps", type=int, default=20, help="steps of the step-based mechanisms, per repeat")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of userdp and uedp-bounded, per repeat")
    parser.add_argument("--q-user", type=float, default=0.5,
                        help="users sampled per round (of the demo's 40; 0.1 keeps a 100M model's round short)")
    parser.add_argument("--local-steps", type=int, default=5, help="local steps per sampled user")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every mechanism")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: uedp's default)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS),
                        help="comma-separated; dpsgd:opacus or dpsgd:exact for another per-example engine")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    import torch

    from uedp.models.device import resolve_device, training_precision
    from uedp.models.threads import use_threads
    from uedp.models.tokenization import load_tokenizer
    from uedp.privacy.population import Population
    from uedp.privacy.randomness import Randomness
    from uedp.services.training_data import prepare_data
    from uedp.services.training_plan import build_mechanism
    from uedp.services.training_setup import loss_function
    from uedp.storage.catalog import Catalog

    use_threads(args.threads)
    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    mechanisms = args.mechanisms.split(",")
    results: dict[tuple[str, str], Measured] = {}
    sizes: dict[str, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = demo_home(Path(tmp))
        for model_name in args.models.split(","):
            kind, size, _ = parse(model_name)
            configs = {mechanism: configuration(mechanism, kind, config_size(kind, size), args, str(device))
                       for mechanism in mechanisms}
            tokenizer = load_tokenizer(next(iter(configs.values())).tokenizer)  # a folder's own, else bytes
            with Catalog(home, "demo") as catalog:  # prepared once, outside the timing, reused by every repeat
                prepared = {mechanism: prepare_data(catalog, config, tokenizer) for mechanism, config in configs.items()}
            for repeat in range(args.repeats):
                for mechanism, config in configs.items():  # interleaved: A B C, A B C, ...
                    model = build(model_name, tokenizer).to(device)
                    sizes[model_name] = (sum(p.numel() for p in model.parameters()),
                                         sum(p.numel() for p in model.parameters() if p.requires_grad))
                    with training_precision(config.precision):  # "noiseless@bf16": the run's --precision
                        seconds, setup, tokens, peak, work = run_once(config, prepared[mechanism], model, device,
                                                                      build_mechanism, loss_function, Population,
                                                                      Randomness,
                                                                      fedavg=mechanism.split("@")[0] == "fedavg")
                    measured = results.setdefault((model_name, mechanism), Measured(work))
                    measured.tokens.append(tokens)
                    measured.seconds.append(seconds)
                    measured.setup.append(setup)
                    measured.peak_mib.append(peak)
                    print(f"  {model_name} {mechanism} (repeat {repeat + 1}/{args.repeats}): {tokens} tokens in "
                          f"{seconds:.1f} s, {tokens / seconds:.0f} tokens/s", file=sys.stderr, flush=True)
                    del model
    report(results, sizes, name, torch.__version__, args.repeats)


def configuration(mechanism: str, kind: str, size: str, args: argparse.Namespace, device: str) -> Any:
    """The configuration a mechanism (``dpsgd:opacus``: with that per-example engine; ``dpsgd@bf16``: with that
    ``--precision``) is benchmarked with."""
    from uedp.privacy.mechanisms import registry
    from uedp.services.config import TrainConfig

    mechanism, _, precision = mechanism.partition("@")
    name, _, per_sample = mechanism.partition(":")
    name = "userdp" if name == "fedavg" else name  # its rounds, run without clipping and noise (run_once)
    rounds = "rounds" in registry.get(name).params.model_fields
    return TrainConfig.for_mechanism(
        name, dataset="demo", model=kind, model_size=size, rounds=args.rounds if rounds else None, steps=args.steps,
        public_steps=max(args.steps // 2, 1), batch_size=args.batch_size, noise_multiplier=1.0, q_user=args.q_user,
        local_steps=args.local_steps,
        holders_per_entity=2, **({"per_sample": per_sample} if per_sample else {}), checkpoint_every=0, device=device,
        precision=precision or "auto")


@contextlib.contextmanager
def without_privacy(active: bool) -> Iterator[None]:
    """userdp's rounds as noiseless FedAvg: every delta kept whole (clip factor 1) and no noise drawn."""
    if not active:
        yield
        return
    from concurrent.futures import Future

    import torch

    from uedp.privacy.mechanisms import fedavg, userdp, vectorized

    def zeros(tensors: Any, std: float, source: Any) -> Future[list[Any]]:
        done: Future[list[Any]] = Future()
        done.set_result([torch.zeros_like(t) for t in tensors])
        return done

    def whole(vector: Any, bound: float) -> float:
        return 1.0

    real_noise, real_clip = userdp.noise_ahead, fedavg.clip_factor
    userdp.noise_ahead, fedavg.clip_factor, vectorized.clip_factor = zeros, whole, whole
    try:
        yield
    finally:
        userdp.noise_ahead, fedavg.clip_factor, vectorized.clip_factor = real_noise, real_clip, real_clip


def run_once(config: Any, data: Any, model: Any, device: Any, build_mechanism: Any, loss_function: Any,
             population: Any, randomness: Any, fedavg: bool = False) -> tuple[float, float, int, float, str]:
    """One timed ``train`` of a mechanism: seconds from its first round, seconds before it, tokens through
    a training pass, peak MiB, work done; with ``fedavg``, userdp's rounds without clipping and noise."""
    import torch

    units = len(data.train.sequences) if config.spec.counts == "sequences" else data.train.n_users
    engine = build_mechanism(config, population.declared(max(units, 1)), len(data.train.sequences),
                             randomness.seeded(0))
    loss = loss_function(config)
    tokens = [0]

    def counting(inner: Any) -> Any:
        def counted(model_: Any, batch: dict[str, Any]) -> Any:
            tokens[0] += int(batch["attention_mask"].sum())
            return inner(model_, batch)
        return counted

    if hasattr(engine, "public_loss"):  # selective's first, noiseless phase has its own objective
        engine.public_loss = counting(engine.public_loss)
    before_rounds: list[float] = []  # seconds before the first round of each round loop
    with PeakMemory(device) as memory, without_privacy(fedavg), timing_setup(before_rounds, device):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        before_rounds.append(start)  # the first entry: when train starts (replaced by what precedes a loop)
        statement = engine.train(model, data.train, counting(loss), device, lambda report: None).statement
        if device.type == "cuda":
            torch.cuda.synchronize()
        end = time.perf_counter()
    setup = sum(before_rounds[1:])
    unit = "rounds" if "rounds" in type(config.params).model_fields else "steps"
    return end - start - setup, setup, tokens[0], memory.mib, f"{statement.rounds} {unit}"


@contextlib.contextmanager
def timing_setup(before_rounds: list[float], device: Any) -> Iterator[None]:
    """Append, per round loop, the seconds from the previous mark (``train``'s start, or the end of the last
    loop) to its first round: what ``train`` does once (holder choice, the accounting plan) before rounds."""
    import torch

    from uedp.privacy.mechanisms import loop

    real = loop.RoundLoop.run
    mark = [0.0]

    def now() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def run(self: Any, body: Any, on_round: Any, checkpoint: Any) -> Any:
        entered = [now() if mark[0] else before_rounds[0]]
        started = [False]

        def timed_body(round_index: int, rng: Any) -> Any:
            if not started[0]:
                started[0] = True
                before_rounds.append(now() - entered[0])
            return body(round_index, rng)
        try:
            return real(self, timed_body, on_round, checkpoint)
        finally:
            mark[0] = 1.0

    loop.RoundLoop.run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        loop.RoundLoop.run = real  # type: ignore[method-assign]


def ratio_to_base(results: dict[tuple[str, str], Measured], model_name: str, mechanism: str) -> float | None:
    """Median tokens/s over its base's: noiseless, or fedavg for the round-based mechanisms when measured."""
    base = results.get((model_name, "noiseless"))
    if mechanism.split("@")[0] in ROUND_BASED and (model_name, "fedavg") in results:
        base = results[(model_name, "fedavg")]
    if base is None:
        return None
    return statistics.median(results[(model_name, mechanism)].rates) / statistics.median(base.rates)


def report(results: dict[tuple[str, str], Measured], sizes: dict[str, tuple[int, int]], device: str, torch_version: str,
           repeats: int) -> None:
    print(f"\nmedian of {repeats} interleaved repeats; spread = lowest-highest tokens/s; ratio of medians to the base: "
          "noiseless, or fedavg (userdp's rounds without clipping and noise) for userdp and uedp-bounded when measured")
    print(f"{'model':<22}{'params':>9}{'trained':>9}  {'mechanism':<16}{'work':>10}{'tokens/s':>10}{'spread':>15}"
          f"{'vs base':>14}{'peak MiB':>10}{'setup s':>9}")
    for (model_name, mechanism), measured in results.items():
        rates = measured.rates
        ratio = ratio_to_base(results, model_name, mechanism)
        total, trained = sizes[model_name]
        print(f"{model_name:<22}{millions(total):>9}{millions(trained):>9}  {mechanism:<16}{measured.work:>10}"
              f"{statistics.median(rates):>10.0f}{f'{min(rates):.0f}-{max(rates):.0f}':>15}"
              f"{'-' if ratio is None else f'{ratio:.2f}x':>14}{statistics.median(measured.peak_mib):>10.0f}"
              f"{statistics.median(measured.setup):>9.2f}")
    cost_versus_size(results, sizes)
    print(f"device: {device}; torch {torch_version}")


def cost_versus_size(results: dict[tuple[str, str], Measured], sizes: dict[str, tuple[int, int]]) -> None:
    """The same ratios as a markdown table, one column per model (the README's speed table)."""
    models = list(dict.fromkeys(model for model, _ in results))
    mechanisms = list(dict.fromkeys(mechanism for _, mechanism in results))
    if len(models) < 2:
        return
    print("\ncost versus size (ratio to the base; first row: the base's median tokens/s)\n")
    print("| mechanism | " + " | ".join(f"{m} ({millions(sizes[m][0])}, {millions(sizes[m][1])} trained)"
                                         for m in models) + " |")
    print("|---|" + "---:|" * len(models))
    if "noiseless" in mechanisms:
        print("| noiseless (tokens/s) | " + " | ".join(
            f"{statistics.median(results[(m, 'noiseless')].rates):,.0f}" if (m, "noiseless") in results else "-"
            for m in models) + " |")
    for mechanism in mechanisms:
        if mechanism == "noiseless":
            continue
        cells = []
        for model in models:
            ratio = ratio_to_base(results, model, mechanism) if (model, mechanism) in results else None
            cells.append("-" if ratio is None else f"{ratio:.2f}x")
        label = (f"{mechanism} (vs fedavg)" if mechanism.split("@")[0] in ROUND_BASED and "fedavg" in mechanisms
                 else mechanism)
        print(f"| {label} | " + " | ".join(cells) + " |")


def millions(count: int) -> str:
    if count < 1e6:
        return f"{count / 1e3:.1f}k"
    return f"{count / 1e6:.2f}M" if count < 1e8 else f"{count / 1e6:.0f}M"


if __name__ == "__main__":
    main()
