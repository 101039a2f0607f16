"""Training throughput of every mechanism against noiseless training: tokens per second on the same
model, data and device (the bundled demo corpus, gold entities).

A token counts when a training forward and backward pass consumes it, whichever mechanism runs that
pass (DP-FedAvg's local steps, DP-SGD's per-example pass, selective's two phases), counted by wrapping
the loss function. Timing covers ``Mechanism.train`` only (data preparation and accountant
calibration are outside), after one warm-up step.

    python benchmarks/train_throughput.py [--models gpt2:tiny,gpt2:small,lstm:tiny] [--steps 100] [--rounds 3]
        [--threads N] [--device auto]

A model is ``kind:size`` (``llama:small``; a checkpoint folder as ``causal-lm:FOLDER``), with ``+loraR`` for
LoRA adapters of rank R (``llama:small+lora8``): only they train.

Step mechanisms (noiseless, deid, dpsgd, selective) run ``--steps`` steps, round mechanisms (userdp,
uedp) ``--rounds`` rounds; accounting is inside the timing, as users pay for it. Aims (issue 16):
dpsgd and selective at >= 0.7x noiseless on CPU, >= 0.8x on a GPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MECHANISMS = ("noiseless", "deid", "dpsgd", "selective", "userdp", "uedp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2:tiny,gpt2:small,lstm:tiny", help="model:size, comma-separated")
    parser.add_argument("--steps", type=int, default=100, help="steps of the step-based mechanisms")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of userdp and uedp")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: uedp's default)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS),
                        help="comma-separated; dpsgd:opacus or selective:opacus for Opacus' per-example path")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    import torch

    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.models.device import resolve_device
    from uedp.models.factory import build_model
    from uedp.models.lora import LoraSettings, with_lora
    from uedp.models.threads import use_threads
    from uedp.models.tokenization import load_tokenizer
    from uedp.privacy.mechanisms import registry
    from uedp.privacy.population import Population
    from uedp.privacy.randomness import Randomness
    from uedp.services.config import TrainConfig
    from uedp.services.detect import detect_entities
    from uedp.services.training_data import prepare_data
    from uedp.services.training_setup import build_mechanism, loss_function
    from uedp.storage.catalog import Catalog
    from uedp.storage.home import DataHome
    from uedp.storage.ingest import IngestOptions, ingest

    use_threads(args.threads)
    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        home = DataHome.from_env(Path(tmp) / "home")
        ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
        detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
        tokenizer = load_tokenizer("byte")
        for model_name, mechanism in [(m, k) for m in args.models.split(",") for k in args.mechanisms.split(",")]:
            kind, _, sized = model_name.partition(":")
            size, _, lora = sized.partition("+lora")
            mechanism_name, _, engine = mechanism.partition(":")  # "dpsgd:opacus": the per-example engine to use
            rounds = "rounds" in registry.get(mechanism_name).params.model_fields
            config = TrainConfig.for_mechanism(
                mechanism_name, dataset="demo", model=kind, model_size=size, rounds=args.rounds if rounds else None,
                steps=args.steps, public_steps=args.steps // 2, batch_size=args.batch_size, noise_multiplier=1.0,
                **({"per_sample": engine} if engine else {}),
                q_user=0.5, checkpoint_every=0, device=str(device))
            with Catalog(home, "demo") as catalog:
                data = prepare_data(catalog, config, tokenizer)
            torch.manual_seed(0)
            model = build_model(config.model, config.model_size, tokenizer).to(device)
            if lora:
                model = with_lora(model, LoraSettings(int(lora), 2.0 * int(lora)))
            units = len(data.train.sequences) if config.spec.counts == "sequences" else data.train.n_users
            engine = build_mechanism(config, Population.declared(max(units, 1)), len(data.train.sequences),
                                     Randomness.seeded(0))
            loss = loss_function(config)
            tokens = [0]

            def counting(loss, tokens=tokens):  # type: ignore[no-untyped-def]
                def counted(model_, batch):  # type: ignore[no-untyped-def]
                    tokens[0] += int(batch["attention_mask"].sum())
                    return loss(model_, batch)
                return counted

            if hasattr(engine, "public_loss"):  # selective's first, noiseless phase has its own objective
                engine.public_loss = counting(engine.public_loss)

            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            statement = engine.train(model, data.train, counting(loss), device, lambda report: None).statement
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            unit = "rounds" if "rounds" in type(config.params).model_fields else "steps"
            if not tokens[0]:  # recurrent selective computes its own losses: expected sampled sequences x mean length
                lengths = [len(s) for s in data.train.sequences]
                tokens[0] = round(statement.sampling_probability * len(lengths) * statement.rounds * sum(lengths) / len(lengths))
                mechanism += "*"
            rows.append((model_name, mechanism, statement.rounds, unit, tokens[0], seconds, tokens[0] / seconds))
            print(f"  {model_name} {mechanism}: {tokens[0]} tokens in {seconds:.1f} s", file=sys.stderr)

    print(f"\n{'model':<20}{'mechanism':<18}{'work':>12}{'tokens':>10}{'s':>8}{'tokens/s':>11}{'vs noiseless':>14}")
    for model_name, mechanism, work, unit, count, seconds, rate in rows:
        base = next((r[6] for r in rows if r[0] == model_name and r[1] == "noiseless"), None)
        ratio = f"{rate / base:.2f}x" if base else "-"
        print(f"{model_name:<20}{mechanism:<18}{f'{work} {unit}':>12}{count:>10}{seconds:>8.1f}{rate:>11.0f}{ratio:>14}")
    print(f"device: {name}; torch {torch.__version__}")
    if any(r[1].endswith("*") for r in rows):
        print("* tokens estimated as sampled sequences x mean sequence length (the mechanism computes its own loss)")


if __name__ == "__main__":
    main()
