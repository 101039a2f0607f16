"""The public corpora a reproduction reads from folders the user names (never downloaded, never
redistributed), and CoNLL-2003's inputs: whole, or the first documents of each file for the ``ci``
scale, ingested through the real flows with their gold entities."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from uedp.errors import UedpError
from uedp.experiments.common import Context

CONLL_FILES = {"eng.train": "train", "eng.testa": "valid", "eng.testb": "test"}
GOLD_CATEGORIES = ["PERSON", "LOC", "ORG", "MISC"]


@dataclass(frozen=True)
class Corpus:
    """A public corpus an experiment reads from a folder the user names: never downloaded at run time,
    never redistributed with uedp."""

    key: str  # conll, wikitext, simdial, sst2, ag
    option: str  # the CLI option naming its folder
    env: str  # the environment variable that may name it instead
    files: str  # what the folder holds, as an error says it
    where: str  # where to get it


CORPORA = {
    "conll": Corpus("conll", "--conll-dir", "UEDP_CONLL_DIR", "eng.train, eng.testa and eng.testb",
                    "CoNLL-2003 (https://www.clips.uantwerpen.be/conll2003/ner/; the Reuters text needs its licence)"),
    "wikitext": Corpus("wikitext", "--wikitext-dir", "UEDP_WIKITEXT_DIR",
                       "valid.txt and test.txt (and train.txt where you have it), or wiki.valid.tokens and "
                       "wiki.test.tokens (and wiki.train.tokens)", "WikiText-2 (https://github.com/pytorch/examples/tree/main/"
                       "word_language_model/data/wikitext-2, or the wikitext-2-v1 archive of Merity et al. 2017)"),
    "simdial": Corpus("simdial", "--simdial-dir", "UEDP_SIMDIAL_DIR",
                      "train/, valid/ and test/ folders of dialogs, one dial-N.txt per dialog",
                      "CustomerSim (https://github.com/wyshi/lm_privacy, data/simdial: the Selective-DP paper's "
                      "10,000 training dialogs with its 10 canaries; or generate it with SimDial's "
                      "multiple_domains.py --domain track_package)"),
    "sst2": Corpus("sst2", "--sst2-dir", "UEDP_SST2_DIR", "train.tsv and dev.tsv (GLUE's SST-2: a header, then "
                   "sentence and label columns in either order)",
                   "SST-2 (GLUE, https://gluebenchmark.com/tasks, or the Hugging Face dataset stanfordnlp/sst2 "
                   "saved as TSV)"),
    "ag": Corpus("ag", "--ag-dir", "UEDP_AG_DIR", "train.csv and test.csv (class,title,description), or "
                 "train.jsonl and test.jsonl ({text, label})",
                 "AG News (Zhang et al. 2015, ag_news_csv.tar.gz, or the Hugging Face dataset fancyzhx/ag_news)"),
}


def corpus_folder(ctx: Context, key: str, required: Iterable[str]) -> Path:
    """The experiment's corpus folder, checked to hold ``required`` (each a file or folder name; a name
    with ``|`` is any one of its alternatives): a missing one is one error naming the option and where
    to get the corpus."""
    corpus = CORPORA[key]
    missing = [name for name in required
               if not any((ctx.data_dir / alternative).exists() for alternative in name.split("|"))]
    if missing:
        raise UedpError(f"{ctx.data_dir}: no {', '.join(m.replace('|', ' or ') for m in missing)}; give "
                        f"{corpus.option} (or {corpus.env}), the folder holding {corpus.files}. Get it from "
                        f"{corpus.where}; uedp never downloads it.")
    return ctx.data_dir


def conll_documents(path: Path) -> list[list[str]]:
    """A CoNLL-2003 file's documents, each its lines from ``-DOCSTART-`` up to the next one."""
    documents: list[list[str]] = []
    with open(path, encoding="utf-8-sig") as handle:
        for line in handle:
            if line.startswith("-DOCSTART-") or not documents:
                documents.append([])
            documents[-1].append(line)
    return [d for d in documents if any(line.strip() and not line.startswith("-DOCSTART-") for line in d)]


def write_if_changed(target: Path, text: str) -> Path:
    """Write a page's copy of its inputs (the first documents of a file, a normalised copy) unless it
    already holds ``text``: an unchanged copy keeps its tables' cache key and its ingest is reused; a
    changed one is swapped in whole (a temporary file, then a rename)."""
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        partial = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        partial.write_text(text, encoding="utf-8")
        partial.replace(target)
    return target


def blank_pipeline(ctx: Context) -> Path:
    """A blank English spaCy pipeline saved once under the data home, for pages whose policy is Presidio
    recognizers: Presidio needs a pipeline to tokenize, the regexes need no NER model, and nothing is
    downloaded. Saved whole (its files are part of the detection's cache key)."""
    folder = ctx.home.reproduce_dir / "inputs" / "spacy-blank-en"
    if not (folder / "meta.json").is_file():
        import spacy

        partial = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        spacy.blank("en").to_disk(partial)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return folder


def conll_inputs(ctx: Context, first: dict[str, int] | None) -> tuple[list[Path], str]:
    """The CoNLL-2003 files to ingest and the dataset name: the files themselves, or (``first``: documents
    per split) a copy of each file's first documents under the data home, which this command writes."""
    if ctx.conll_dir is None:
        raise UedpError(f"{ctx.name} reads CoNLL-2003: give --conll-dir, the folder holding eng.train, eng.testa and "
                        f"eng.testb (get them from {CORPORA['conll'].where})")
    paths = {name: ctx.conll_dir / name for name in CONLL_FILES}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise UedpError(f"CoNLL-2003 file(s) not found: {', '.join(missing)}; give --conll-dir, the folder holding "
                        f"eng.train, eng.testa and eng.testb (they are not redistributed with uedp; get them from "
                        f"{CORPORA['conll'].where})")
    if not first:
        return list(paths.values()), "conll2003"
    tag = "-".join(str(first[split]) for split in CONLL_FILES.values())
    folder = ctx.home.reproduce_dir / "inputs" / f"conll2003-first-{tag}"
    folder.mkdir(parents=True, exist_ok=True)
    for name, path in paths.items():
        documents = conll_documents(path)[: first[CONLL_FILES[name]]]
        text = "".join(line for document in documents for line in document)
        write_if_changed(folder / name, text)
    return [folder / name for name in CONLL_FILES], f"conll2003-first-{tag}"


def train_documents(paths: list[Path]) -> int:
    """Documents (users) in the train file: the input's own count, as the papers give |U|."""
    return len(conll_documents(next(p for p in paths if p.name == "eng.train")))


def ingest_conll_gold(ctx: Context, first: dict[str, int] | None) -> tuple[str, int]:
    """Ingest CoNLL-2003 (one user per document) and take its gold entities; reused when unchanged."""
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.detect import detect_flow
    from uedp.flows.ingest import IngestConfig, ingest_flow

    paths, dataset = conll_inputs(ctx, first)
    ctx.say(f"ingest {dataset} from {paths[0].parent}")
    ingest_flow(IngestConfig(home=str(ctx.home.root), dataset=dataset, format="conll2003",
                             files=[str(p) for p in paths]))
    detect_flow(dataset, DetectorConfig(detectors=["gold"]), home=str(ctx.home.root))
    return dataset, train_documents(paths)
