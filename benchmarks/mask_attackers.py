"""How strong is each offline attacker for the mask-token inference attack (the thesis' Table 3.7)?

Both are built from CoNLL-2003's validation file (``eng.testa``, the public text of the sanitize-conll
page) and attack the original text of a seeded sample of ``eng.train`` sentences: each word is masked
in turn and counts as recovered when the guess is that word. An attacker whose guesses do not depend on
the context scores the same on every release, whatever it keeps, and cannot tell releases apart.

* ``bert``: the small BERT of ``train_masked_lm`` (the Hugging Face path of the attack), ``--bert-steps``;
* ``cloze``: the bigram cloze model (``privacy/attacks/cloze.py``), what the page uses.

    python benchmarks/mask_attackers.py [--conll-dir ../shared/data/conll2003] [--sentences 200] [--bert-steps 600]

Prints one line per attacker (build seconds, words recovered, distinct guesses, the commonest guesses)
and their JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch


def sentences(path: Path) -> list[str]:
    from uedp.storage.formats.conll import read_conll

    return [sentence.text for sentence in read_conll(path)]


def measure(name: str, predict, seconds: float, attacked: list[list[str]]) -> dict[str, object]:  # type: ignore[no-untyped-def]
    jobs = [(words, j) for words in attacked for j in range(len(words))]
    guesses: list[str] = []
    for start in range(0, len(jobs), 64):
        chunk = jobs[start:start + 64]
        guesses += predict([w for w, _ in chunk], [j for _, j in chunk])
    right = sum(g.strip().lower() == w[j].lower() for g, (w, j) in zip(guesses, jobs))
    common = Counter(guesses).most_common(4)
    return {"attacker": name, "build_seconds": round(seconds, 1), "words": len(jobs),
            "recovered": round(right / len(jobs), 4), "distinct_guesses": len(set(guesses)),
            "commonest": [[g, round(n / len(jobs), 3)] for g, n in common]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conll-dir", type=Path, default=Path("../shared/data/conll2003"))
    parser.add_argument("--sentences", type=int, default=200, help="train sentences attacked")
    parser.add_argument("--bert-steps", type=int, default=600, help="the small BERT's training steps (the page's)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from uedp.privacy.attacks.cloze import BigramCloze
    from uedp.privacy.attacks.mask_inference import masked_lm_predictor, train_masked_lm
    from uedp.privacy.sanitization.embeddings import words_of

    public = sentences(args.conll_dir / "eng.testa")
    private = sentences(args.conll_dir / "eng.train")
    attacked = [words_of(s) for s in random.Random(0).sample(private, args.sentences)]
    rows = []
    started = time.perf_counter()
    cloze = BigramCloze.fit(public)
    rows.append(measure("cloze", cloze.predict, time.perf_counter() - started, attacked))
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        path = train_masked_lm(public, Path(folder) / "bert", steps=args.bert_steps)
        seconds = time.perf_counter() - started
        bert = masked_lm_predictor(AutoModelForMaskedLM.from_pretrained(path), AutoTokenizer.from_pretrained(path),
                                   torch.device("cpu"))
        rows.append(measure(f"bert ({args.bert_steps} steps)", bert, seconds, attacked))
    print(f"{len(public)} public sentences (eng.testa); {args.sentences} train sentences attacked on their original text")
    for row in rows:
        print(f"{row['attacker']:>18}: built in {row['build_seconds']:>6} s, recovered {row['recovered']:.1%} of "
              f"{row['words']} words, {row['distinct_guesses']} distinct guesses, commonest {row['commonest']}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
