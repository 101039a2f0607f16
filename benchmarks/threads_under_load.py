"""How torch's intra-op thread count behaves when the machine is shared: one tiny GPT-2 training step
(a batch of 32 short sentences, SGD) at each thread count, on an idle machine and with ``--busy`` other
processes spinning on a core, optionally with ``OMP_WAIT_POLICY=PASSIVE``.

Each configuration runs in its own process (OpenMP reads its settings at start-up).

    python benchmarks/threads_under_load.py [--busy 1] [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

CHILD = "--child"


def one_configuration(threads: int, steps: int) -> float:
    """Milliseconds per step, in this process."""
    import torch

    from uedp.models.batching import collate, encode
    from uedp.models.gpt2 import build_gpt2
    from uedp.models.metrics import causal_lm_loss
    from uedp.models.tokenization import byte_level_tokenizer

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    tokenizer = byte_level_tokenizer()
    model = build_gpt2("tiny", len(tokenizer), tokenizer.eos_token_id)
    texts = [f"user {u} wrote message {i} about Leeds" for u in range(4) for i in range(8)]
    batch = collate(encode(tokenizer, texts, 48), tokenizer.pad_token_id)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step() -> None:
        optimizer.zero_grad()
        causal_lm_loss(model, batch).backward()
        optimizer.step()

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1000


def measure(threads: int, steps: int, passive: bool) -> float:
    env = os.environ | ({"OMP_WAIT_POLICY": "PASSIVE"} if passive else {})
    env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run([sys.executable, __file__, CHILD, str(threads), str(steps)], env=env, check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=1, help="spinning processes for the 'loaded' column")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    counts = sorted({1, cores})
    rows = {}
    for passive in (False, True):
        for threads in counts:
            rows[(passive, threads, "idle")] = measure(threads, args.steps, passive)
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            time.sleep(1)
            for threads in counts:
                rows[(passive, threads, "loaded")] = measure(threads, args.steps, passive)
        finally:
            for spinner in spinners:
                spinner.kill()
    print(f"ms per tiny GPT-2 step; {cores} cores in this process' affinity; loaded = {args.busy} spinning process(es)\n")
    print(f"{'threads':>8}{'idle':>10}{'loaded':>10}{'idle, passive':>16}{'loaded, passive':>18}")
    for threads in counts:
        cells = [rows[(p, threads, load)] for p in (False, True) for load in ("idle", "loaded")]
        print(f"{threads:>8}{cells[0]:>10.1f}{cells[1]:>10.1f}{cells[2]:>16.1f}{cells[3]:>18.1f}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == CHILD:
        print(one_configuration(int(sys.argv[2]), int(sys.argv[3])))
    else:
        main()
