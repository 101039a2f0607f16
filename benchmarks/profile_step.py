"""Where one mechanism's training time goes: torch's profiler over a few steps of ``Mechanism.train`` on
the demo corpus, the operators that took the most time (self time, so nothing is counted twice), and the
share of the time spent in uedp's own phases (per-example clipping, secret noise, accounting, the
optimizer), measured by wrapping them.

    python benchmarks/profile_step.py [--model gpt2:100m] [--mechanism dpsgd] [--steps 3] [--threads 2]

Models as in ``train_throughput.py`` (``gpt2:100m``, ``llama:100m+lora8``, presets).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_throughput import build, config_size, demo_home, millions, parse  # the model sizes, defined once there


def timed(phases: dict[str, float], name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with its wall time added to ``phases[name]``."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            phases[name] += time.perf_counter() - start
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2:100m")
    parser.add_argument("--mechanism", default="dpsgd")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from uedp.models.threads import use_threads
    from uedp.models.tokenization import load_tokenizer
    from uedp.privacy import primitives
    from uedp.privacy.accounting import rounds as round_accounting
    from uedp.privacy.mechanisms import dpsgd
    from uedp.privacy.population import Population
    from uedp.privacy.randomness import Randomness
    from uedp.services.config import TrainConfig
    from uedp.services.training_data import prepare_data
    from uedp.services.training_plan import build_mechanism
    from uedp.services.training_setup import loss_function
    from uedp.storage.catalog import Catalog

    use_threads(args.threads)
    phases: dict[str, float] = collections.defaultdict(float)
    # uedp's own phases, by wrapping the functions the step calls (module attributes, so calls see the wrapper)
    dpsgd.DpSgd.clipped_gradient_sum = timed(phases, "per-example clipping (forward, backward, norms, sum)",
                                             dpsgd.DpSgd.clipped_gradient_sum)
    # the noise is drawn on a background thread while the step computes: its own time, and the step's wait for it
    primitives._noise_shaped = timed(phases, "secret noise (drawn on a background thread)", primitives._noise_shaped)
    concurrent.futures.Future.result = timed(phases, "waiting for the noise", concurrent.futures.Future.result)
    for method in ("schedule_for", "spend", "exact_after"):  # planned before the first step; spend only counts
        setattr(round_accounting.RoundAccountant, method, timed(phases, "accounting (planned before the first step)",
                                                          getattr(round_accounting.RoundAccountant, method)))
    torch.optim.Adam.step = timed(phases, "optimizer (Adam)", torch.optim.Adam.step)

    kind, size, _ = parse(args.model)
    device = torch.device("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        home = demo_home(Path(tmp))
        config = TrainConfig.for_mechanism(args.mechanism, dataset="demo", model=kind, model_size=config_size(kind, size),
                                           steps=args.steps, batch_size=args.batch_size, noise_multiplier=1.0,
                                           checkpoint_every=0, device="cpu")
        tokenizer = load_tokenizer(config.tokenizer)
        with Catalog(home, "demo") as catalog:
            data = prepare_data(catalog, config, tokenizer)
        model = build(args.model, tokenizer)
        engine = build_mechanism(config, Population.declared(len(data.train.sequences)), len(data.train.sequences),
                                 Randomness.seeded(0))
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            engine.train(model, data.train, loss_function(config), device, lambda report: None)
        total = time.perf_counter() - start
    print(f"{args.model} {args.mechanism}: {args.steps} steps in {total:.1f} s "
          f"({millions(sum(p.numel() for p in model.parameters() if p.requires_grad))} trained parameters)")
    for name, seconds in sorted(phases.items(), key=lambda item: -item[1]):
        print(f"  {name:<55}{seconds:>8.2f} s {100 * seconds / total:>6.1f}%")
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
