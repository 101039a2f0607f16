"""Detection throughput: uedp's batched spaCy + Presidio pass against Presidio's per-sentence
``AnalyzerEngine.analyze``, on real CoNLL-2003 sentences, with identical spans required; then the
coverage of each automatic detector against the CoNLL gold tags.

No pretrained spaCy pipeline can be downloaded here, so the script trains a small NER (spaCy's default
CNN architecture) on ``eng.train`` first and caches it; pass ``--spacy-model`` to use a real one
(e.g. ``en_core_web_sm``).

    python benchmarks/detect_throughput.py [--sentences 14041] [--workers 2] [--train-sentences 4000] [--epochs 3]

Throughput is measured on eng.train (the NER's own training sentences: speed does not depend on
that); coverage on eng.testb, which the NER never saw.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONLL = REPO.parent / "shared" / "data" / "conll2003"
CACHE = Path.home() / ".cache" / "uedp" / "benchmarks"
SPACY_LABELS = {"PER": "PERSON", "ORG": "ORG", "LOC": "GPE", "MISC": "NORP"}


def train_conll_ner(train_sentences: int, epochs: int, seed: int = 0) -> Path:
    """A small spaCy NER trained on the first sentences of eng.train; cached by its settings."""
    import spacy
    from spacy.training import Example

    from uedp.storage.formats.conll import read_conll

    key = hashlib.sha256(f"{train_sentences}:{epochs}:{seed}:{spacy.__version__}".encode()).hexdigest()[:12]
    out = CACHE / f"conll-ner-{key}"
    if (out / "meta.json").exists():
        return out
    data = [s for s in read_conll(CONLL / "eng.train")][:train_sentences]
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("ner")
    for label in SPACY_LABELS.values():
        ner.add_label(label)
    examples = []
    for sent in data:
        doc = nlp.make_doc(sent.text)
        ents = [(s["start"], s["end"], SPACY_LABELS[s["label"]]) for s in sent.spans()]
        examples.append(Example.from_dict(doc, {"entities": ents}))
    random.seed(seed)
    optimizer = nlp.initialize(lambda: examples)
    for epoch in range(epochs):
        random.shuffle(examples)
        losses: dict[str, float] = {}
        for start in range(0, len(examples), 32):
            nlp.update(examples[start:start + 32], sgd=optimizer, losses=losses, drop=0.1)
        print(f"  trained NER epoch {epoch + 1}/{epochs}: loss {losses['ner']:.1f}", file=sys.stderr)
    out.parent.mkdir(parents=True, exist_ok=True)
    nlp.to_disk(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=14041, help="sentences of eng.train to detect in")
    parser.add_argument("--train-sentences", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--spacy-model", default=None, help="use this pipeline instead of training one")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    from uedp.detection.categories import taxonomy
    from uedp.detection.pipeline import DetectorConfig, detect
    from uedp.detection.presidio_engine import build_analyzer
    from uedp.detection.spacy_pipeline import load_pipeline
    from uedp.storage.catalog import Catalog
    from uedp.storage.home import DataHome
    from uedp.storage.ingest import IngestOptions, ingest
    from uedp.storage.tables import read_table

    model = args.spacy_model or str(train_conll_ner(args.train_sentences, args.epochs))
    tax = taxonomy()
    with tempfile.TemporaryDirectory() as tmp:
        home = DataHome.from_env(Path(tmp) / "home")
        ingest(home, "train", [CONLL / "eng.train"], IngestOptions(format="conll2003"))
        ingest(home, "testb", [CONLL / "eng.testb"], IngestOptions(format="conll2003"))
        sentences = read_table(home.table_dir("train", "sentences")).slice(0, args.sentences)
        texts = sentences.column("text").to_pylist()

        # Baseline: what a user of Presidio writes, one analyze call (and one spaCy parse) per sentence.
        analyzer, _ = build_analyzer(load_pipeline(model))
        analyzer.analyze("warm up", "en")
        start = time.perf_counter()
        baseline = []
        for index, text in enumerate(texts):
            best: dict[tuple[int, int, str], float] = {}
            for r in analyzer.analyze(text, "en", score_threshold=0.4):
                best[(r.start, r.end, r.entity_type)] = max(best.get((r.start, r.end, r.entity_type), 0.0), r.score)
            baseline += [(index, s, e, tax.canonical_of(label), round(score, 6)) for (s, e, label), score in best.items()]
        baseline_s = time.perf_counter() - start

        figures = []
        for workers in sorted({1, args.workers}):
            config = DetectorConfig(detectors=["presidio"], spacy_model=model, workers=workers, batch_size=256)
            start = time.perf_counter()  # includes building the analyzer (and starting workers)
            rows = [r for chunk in detect(sentences.to_batches(max_chunksize=1000), config, tax) for r in chunk]
            seconds = time.perf_counter() - start
            ours = [(r["sentence_id"] - sentences.column("sentence_id")[0].as_py(), r["start"], r["end"], r["category"],
                     round(r["score"], 6)) for r in rows]
            figures.append((workers, seconds, sorted(ours) == sorted(baseline), len(ours)))

        n = len(texts)
        print(f"\n{'what':<46}{'sentences':>10}{'spans':>8}{'s':>8}{'sent/s':>9}{'ratio':>7}  identical spans")
        print(f"{'Presidio analyze() per sentence, 1 process':<46}{n:>10}{len(baseline):>8}{baseline_s:>8.1f}{n / baseline_s:>9.0f}{1:>7.1f}  -")
        for workers, seconds, same, spans in figures:
            print(f"{f'uedp batched spaCy+Presidio, {workers} worker(s)':<46}{n:>10}{spans:>8}{seconds:>8.1f}"
                  f"{n / seconds:>9.0f}{baseline_s / seconds:>7.1f}  {same}")
        print(f"device: CPU ({__import__('os').cpu_count()} cores); spaCy pipeline: {Path(model).name}")

        # Coverage of each automatic detector against gold, on all of eng.testb.
        detect_config = DetectorConfig(detectors=["gold", "spacy", "presidio"], spacy_model=model,
                                       workers=args.workers)
        from uedp.storage.schemas import ENTITIES
        from uedp.storage.tables import TableWriter

        parquet_batches = read_table(home.table_dir("testb", "sentences")).to_batches(max_chunksize=2000)
        with TableWriter(home.table_dir("testb", "entities"), ENTITIES, "bench") as writer:
            for chunk in detect(parquet_batches, detect_config, tax):
                writer.write_rows(chunk)
        with Catalog(home, "testb") as catalog:
            print(f"\ncoverage on eng.testb ({catalog.con.execute('SELECT count(*) FROM sentences').fetchone()[0]} "
                  "sentences) against gold CoNLL tags")
            print(f"{'detector':<10}{'class':<6}{'gold':>7}{'pred':>7}{'exact':>7}{'P':>7}{'R':>7}{'overlap R':>11}")
            for detector in ("spacy", "presidio"):
                for cls, n_ref, n_pred, tp, p, r, overlap in catalog.coverage(detector, tax.coarse):
                    print(f"{detector:<10}{cls:<6}{n_ref:>7}{n_pred:>7}{tp:>7}{p:>7.3f}{r:>7.3f}{overlap:>11.3f}")


if __name__ == "__main__":
    main()
