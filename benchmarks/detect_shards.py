"""Sharded detection on a Dask cluster against the one-task pass, end to end through the Prefect flow
(cluster start-up, shard tasks, merge included), on CoNLL-2003 eng.train with spaCy + Presidio.
The tables must be identical; the script fails otherwise.

    python benchmarks/detect_shards.py [--sentences 14041] [--rows-per-shard 2000] [--dask-workers 2]
                                       [--dask-address tcp://host:8786]

The NER is the small one benchmarks/detect_throughput.py trains and caches (or --spacy-model).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=14_041)
    parser.add_argument("--rows-per-shard", type=int, default=2_000)
    parser.add_argument("--dask-workers", type=int, default=2)
    parser.add_argument("--dask-address", default=None)
    parser.add_argument("--spacy-model", default=None)
    args = parser.parse_args()

    from detect_throughput import CONLL, train_conll_ner
    from prefect.testing.utilities import prefect_test_harness

    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.detect import ScaleOut, detect_flow
    from uedp.storage.home import DataHome
    from uedp.storage.ingest import IngestOptions, ingest
    from uedp.storage.tables import read_table

    model = args.spacy_model or str(train_conll_ner(4_000, 3))
    config = DetectorConfig(detectors=["spacy", "presidio"], spacy_model=model)
    with tempfile.TemporaryDirectory() as tmp, prefect_test_harness(server_startup_timeout=120):
        home = DataHome.from_env(Path(tmp) / "home")
        source = Path(tmp) / "train.conll"
        lines = (CONLL / "eng.train").read_text(encoding="utf-8").split("\n\n")
        source.write_text("\n\n".join(lines[: args.sentences + 1]), encoding="utf-8")  # +1: -DOCSTART-
        ingest(home, "bench", [source], IngestOptions(format="conll2003"))
        n = read_table(home.table_dir("bench", "sentences")).num_rows
        rows = {}
        timings = {}
        for name, scale_out in [
            ("one task (1 process)", ScaleOut()),
            (f"shards of {args.rows_per_shard} on Dask ({args.dask_address or f'{args.dask_workers} local workers'})",
             ScaleOut(rows_per_shard=args.rows_per_shard, runner="dask", dask_workers=args.dask_workers,
                      dask_address=args.dask_address)),
        ]:
            entities = home.table_dir("bench", "entities")
            if entities.exists():
                (entities / "manifest.json").unlink()
            start = time.perf_counter()
            result = detect_flow("bench", config, home=str(home.root), scale_out=scale_out)
            timings[name] = time.perf_counter() - start
            rows[name] = sorted(map(tuple, (r.values() for r in read_table(entities).to_pylist())))
            print(f"  {name}: {result.entities} spans, {result.shards} shard(s)", file=sys.stderr)
    first, *others = rows.values()
    if any(other != first for other in others):
        raise SystemExit("FAIL: sharded detection produced a different table")
    base = next(iter(timings.values()))
    print(f"\n{n} sentences, detectors spacy+presidio, identical tables\n")
    print("| run | seconds | sentences/s | speed-up |\n|---|---:|---:|---:|")
    for name, seconds in timings.items():
        print(f"| {name} | {seconds:.1f} | {n / seconds:,.0f} | {base / seconds:.2f}x |")


if __name__ == "__main__":
    main()
