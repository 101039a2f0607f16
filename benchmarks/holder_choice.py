"""uedp-bounded's holder choice on CoNLL-2003 gold entities: the share of sensitive sentences each
strategy keeps at each k (holders per entity), and how long the choice takes.

Every document is a user; a sentence's entities are its gold spans, keyed as detection keys them
(category + normalized surface). Only the attribution graph reaches the choice.

    python benchmarks/holder_choice.py --conll ../shared/data/conll2003/eng.train [--k 1 2 4 8 16]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from uedp.detection.identity import entity_key
from uedp.privacy.attribution import HOLDER_CHOICES, AttributionGraph, choose_holders
from uedp.storage.formats.conll import conll_records


def gold_entity_sets(path: Path) -> dict[str, list[frozenset[str]]]:
    entities: dict[str, list[frozenset[str]]] = {}
    for record in conll_records(path):
        keys = frozenset(entity_key(record.text[int(span["start"]):int(span["end"])])
                         for span in record.gold_spans or [])
        entities.setdefault(record.user, []).append(keys)
    return entities


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conll", type=Path, required=True)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    args = parser.parse_args()
    graph = AttributionGraph.from_entity_sets(gold_entity_sets(args.conll))
    print(f"{args.conll.name}: {len(graph.users)} users, {graph.n_sentences} sentences, {graph.n_sensitive} with an "
          f"entity, {graph.n_entities} entities (by occurrence)")
    strategies = [s for s in HOLDER_CHOICES if s != "best"]
    print("| k | " + " | ".join(f"{s}: sensitive kept" for s in strategies) + " | time (gain) |")
    print("|---:|" + "---:|" * len(strategies) + "---:|")
    for k in args.k:
        cells, seconds = [], 0.0
        for strategy in strategies:
            start = time.perf_counter()
            result = choose_holders(graph, k, strategy)  # type: ignore[arg-type]
            if strategy == "gain":
                seconds = time.perf_counter() - start
            cells.append(f"{result.sensitive_kept / graph.n_sensitive:.1%} ({result.sensitive_kept})")
        print(f"| {k} | " + " | ".join(cells) + f" | {seconds:.2f} s |")


if __name__ == "__main__":
    main()
