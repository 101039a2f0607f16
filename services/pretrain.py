"""``uedp pretrain``: a public base model, built once per data home and reused by content key.

Private fine-tuning starts, as users do it, from a model pretrained on public text. This composes what
uedp already has into that start:

1. the public corpus is ingested as a dataset (Reuters-21578 by default: 1987 newswire, disjoint in time
   from CoNLL-2003's 1996-97 Reuters text);
2. a byte-level BPE vocabulary is learnt from that dataset's train split only, and saved as a tokenizer
   folder named after the text it learnt from (:func:`public_tokenizer`), with that text's lineage beside
   it, so that no run can use it on the text it came from;
3. a noiseless ``uedp train`` on the dataset with that vocabulary and ``--log-model``: an MLflow run like
   any other public run, whose model carries its lineage marker (:mod:`services.lineage`), so
   ``--init-from RUN`` (with ``--tokenizer FOLDER``) or ``--init-from FOLDER`` starts from it and a run on
   the public corpus' own text is refused;
4. its perplexity on other held-out files (CoNLL-2003's test file) before any fine-tuning, logged to the
   same run.

A base is identified by the text it learnt from (its content key, not its name), the vocabulary and
every training setting; ``<home>/bases/<key>.json`` records it, and a second ``uedp pretrain`` with the
same inputs reuses it. The training run resumes from its checkpoint after an interruption.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from uedp.errors import UedpError
from uedp.models.checkpoints import content_hash
from uedp.services.config import HOME_HELP
from uedp.storage.home import DataHome
from uedp.storage.schemas import SPLITS
from uedp.storage.tables import hash_config

BASE_TAG = "uedp.base"  # on the pretraining run: the base's key
BASE_RECORD_VERSION = 1


class PretrainConfig(BaseModel):
    """What a base is made of: the ``uedp pretrain`` command's options and the ``uedp-pretrain`` flow's form.
    Every field but ``home``, ``threads``, ``device``, ``checkpoint_every``, the dataset's name and the
    evaluation files is part of the base's key (with the corpus' text itself)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: str = Field("", description=HOME_HELP)
    files: list[str] = Field(min_length=1, description="the public corpus: files, or folders standing for their "
                             "files (Reuters-21578: its reut2-*.sgm files), on the machine that trains")
    format: str = Field("reuters21578", description="the corpus' format (as `uedp ingest`)")
    dataset: str = Field("reuters21578", description="the dataset the public corpus is ingested as")
    model: Literal["gpt2", "llama"] = Field("gpt2", description="the base's architecture")
    size: Literal["auto", "tiny", "small", "base", "large"] = Field(
        "auto", description="auto (base on a CPU, large on a GPU), base (13.9M parameters as gpt2: about an hour on "
        "2 CPU cores), large (GPT-2 117M's shape), small (1.9M: the cpu reproductions' base) or tiny (tests)")
    vocab_size: int = Field(8192, ge=257, description="tokens of the byte-level BPE vocabulary learnt from the "
                            "corpus' train split")
    steps: int = Field(2000, ge=1, description="optimizer steps (Adam)")
    batch_size: int = Field(32, ge=1, description="sentences per step")
    lr: float = Field(1e-3, gt=0, description="Adam's learning rate")
    max_len: int = Field(64, ge=8, le=1024, description="tokens per sentence at most (a longer one is cut: a "
                         "step costs as much as the longest sentence of its batch)")
    seed: int = Field(0, description="initial weights and batch order")
    checkpoint_every: int = Field(100, ge=0, description="save a resumable checkpoint every N steps (0: never)")
    threads: int | None = Field(None, ge=1, description="torch threads (default: OMP_NUM_THREADS, else this process' share of the CPUs other work leaves free)")
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    eval_files: list[str] = Field(default_factory=list, description="held-out text to report the base's "
                                  "perplexity on before any fine-tuning, e.g. CoNLL-2003's eng.testb")
    eval_format: str = Field("conll2003", description="the format of the evaluation files")

    @model_validator(mode="after")
    def _known_formats(self) -> PretrainConfig:
        from uedp.storage.formats.registry import get_format

        get_format(self.format)
        get_format(self.eval_format)
        return self

    def resolved(self) -> PretrainConfig:
        """``size`` auto resolved for the device, and folders expanded into their files (sorted): what the
        key and the run see. A missing file is an error here, before an hour of training."""
        from uedp.storage.ingest import files_of

        given = [Path(name).expanduser() for name in self.files]
        for path in given:
            if not path.exists():
                raise UedpError(f"{path}: file not found")
        files = [str(p) for p in files_of(given, self.format)[0]]
        for name in self.eval_files:
            if not Path(name).expanduser().is_file():
                raise UedpError(f"--eval-file {name}: file not found")
        size = default_size(self.device) if self.size == "auto" else self.size
        return self.model_copy(update={"files": files, "size": size})

    def key_fields(self) -> dict[str, Any]:
        """The settings that make one base differ from another (the text is keyed apart, by content)."""
        return self.model_dump(exclude={"home", "files", "threads", "device", "eval_files", "eval_format", "dataset",
                                        "checkpoint_every"})


@dataclass(frozen=True)
class Base:
    """A built base: where it is, how to start from it, and what it measured."""

    key: str
    run_id: str
    model_folder: str  # the logged model, downloaded into the data home (a start for --init-from FOLDER)
    tokenizer_folder: str
    dataset: str
    model: str
    size: str
    parameters: int
    steps: int
    minutes: float
    perplexity_valid: float
    perplexity_test: float
    held_out: dict[str, float] = field(default_factory=dict)  # file name -> perplexity before fine-tuning
    reused: bool = False

    def start_flags(self) -> list[str]:
        """The ``uedp train`` flags that start a run from this base."""
        return ["--model", self.model, "--init-from", self.run_id, "--tokenizer", self.tokenizer_folder]


def default_size(device: str) -> str:
    """The base size for where it trains: ``base`` on a CPU (about an hour on 2 cores), ``large`` (GPT-2
    117M's shape) where ``device`` resolves to a GPU."""
    from uedp.models.device import resolve_device

    return "large" if resolve_device(device).type == "cuda" else "base"


def public_tokenizer(home: DataHome, dataset: str, vocab_size: int, say: Callable[[str], None] = print) -> Path:
    """The byte-level BPE tokenizer learnt from ``dataset``'s train split, built once: a folder
    ``<home>/tokenizers/bpe<vocab>-<dataset>-<text key>`` whose ``vocabulary_source.json`` names the text
    it learnt from and carries that text's keyed lineage (a run on that text is refused)."""
    from uedp.models.tokenization import save_bpe_tokenizer, train_bpe_tokenizer, vocabulary_source
    from uedp.services.lineage import text_lineage
    from uedp.services.text_overlap import remember
    from uedp.storage.catalog import Catalog
    from uedp.storage.text_identity import table_text_key

    text = table_text_key(home.table_dir(dataset, "sentences"))
    folder = home.tokenizers_dir / f"bpe{vocab_size}-{dataset}-{text[:12]}"
    if vocabulary_source(folder) is not None:
        return folder
    texts = [row[2] for row in Catalog(home, dataset).sentences("train")]
    if not texts:
        raise UedpError(f"dataset {dataset!r} has no train split to learn a vocabulary from")
    say(f"learning a {vocab_size}-token byte-level BPE vocabulary from {dataset}'s train split "
        f"({len(texts):,} sentences)")
    tokenizer = train_bpe_tokenizer(texts, vocab_size)
    remember(home, dataset)  # its sentences, for the checks of copies of part of it (services.text_overlap)
    source = {"dataset": dataset, "split": "train", "sentences": len(texts), "text_key": text,
              "lineage": list(text_lineage(home, dataset)), "vocab_size": vocab_size, "kind": "byte-level BPE",
              "public": True}
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:  # never a half-saved vocabulary
        save_bpe_tokenizer(tokenizer, Path(tmp) / "tokenizer", source)
        try:
            os.replace(Path(tmp) / "tokenizer", folder)
        except OSError:  # another process saved the same vocabulary first
            if vocabulary_source(folder) is None:
                raise
    return folder


def _train_config(config: PretrainConfig, tokenizer: Path) -> Any:
    from uedp.services.config import TrainConfig

    return TrainConfig.for_mechanism(
        "noiseless", dataset=config.dataset, model=config.model, model_size=config.size, tokenizer=str(tokenizer),
        steps=config.steps, batch_size=config.batch_size, lr=config.lr, seed=config.seed, max_len=config.max_len,
        log_model=True, checkpoint_every=config.checkpoint_every, threads=config.threads, device=config.device,
        categories=["PERSON"],  # noiseless training ignores categories; any valid list
    )


def base_key(home: DataHome, config: PretrainConfig, tokenizer: Path) -> str:
    """What the base is: its text (content key), its vocabulary (content hash) and its training settings."""
    from uedp.storage.text_identity import table_text_key

    return hash_config({"version": BASE_RECORD_VERSION,
                        "text": table_text_key(home.table_dir(config.dataset, "sentences")),
                        "tokenizer": content_hash(tokenizer),
                        "training": config.key_fields()})


def _record_path(home: DataHome, key: str) -> Path:
    return home.bases_dir / f"{key[:16]}.json"


def recorded_base(home: DataHome, key: str) -> Base | None:
    """The base built with ``key``, when its record and model folder are still in the data home."""
    path = _record_path(home, key)
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    base = Base(**{**data, "reused": True})
    return base if Path(base.model_folder).is_dir() and Path(base.tokenizer_folder).is_dir() else None


def held_out_perplexity(model: Any, tokenizer_folder: Path, files: Sequence[Path], file_format: str,
                        max_len: int, device: str = "auto") -> dict[str, float]:
    """``model``'s token-weighted perplexity on each file's text (read as ``file_format``), as runs
    measure their test split. The files are held-out text: like any test perplexity, outside every epsilon."""
    import torch

    from uedp.models.batching import encode
    from uedp.models.device import resolve_device
    from uedp.models.metrics import perplexity
    from uedp.models.tokenization import load_tokenizer
    from uedp.storage.formats.registry import get_format
    from uedp.storage.ingest import IngestOptions

    tokenizer = load_tokenizer(tokenizer_folder)
    target = resolve_device(device)
    model.to(target)
    options = IngestOptions(format=file_format)
    out: dict[str, float] = {}
    with torch.no_grad():
        for path in files:
            texts = [record.text for record in get_format(file_format).read(Path(path), options)]
            out[Path(path).name] = perplexity(model, encode(tokenizer, texts, max_len), tokenizer.pad_token_id, target)
    return out


def pretrain(home: DataHome, config: PretrainConfig, say: Callable[[str], None] = print,
             progress: bool = True) -> Base:
    """Build (or reuse) the base ``config`` describes; see the module's docstring for the steps."""
    from uedp.models.checkpoints import checkpoint_kind
    from uedp.models.saving import load_saved
    from uedp.services.initial_model import init_folder
    from uedp.services.launch import run_training
    from uedp.services.tracking import RunTracker
    from uedp.storage.ingest import IngestOptions, ingest

    config = config.resolved()
    started = time.monotonic()
    result = ingest(home, config.dataset, [Path(f) for f in config.files], IngestOptions(format=config.format), progress=progress)
    say(f"public corpus {config.dataset}: {result.sentences:,} sentences "
        f"({', '.join(f'{s} {n:,}' for s in SPLITS if (n := result.per_split.get(s)))})"
        + (" (already ingested)" if result.reused else ""))
    tokenizer = public_tokenizer(home, config.dataset, config.vocab_size, say)
    key = base_key(home, config, tokenizer)
    if (base := recorded_base(home, key)) is not None:
        say(f"base {key[:16]} already built: run {base.run_id}")
        return _measured_on(home, key, base, config)
    train_config = _train_config(config, tokenizer)
    say(f"pretraining {config.model} {config.size} noiselessly on {config.dataset} ({config.steps:,} steps of "
        f"{config.batch_size} sentences); the corpus and the base are public from here on")
    trained = run_training(home, train_config, progress=progress)
    folder = init_folder(home, trained.run_id)
    model = load_saved(folder, checkpoint_kind(folder))  # the logged model, loaded once, as a start loads it
    parameters = sum(p.numel() for p in model.parameters())
    held_out = (held_out_perplexity(model, tokenizer, [Path(f) for f in config.eval_files], config.eval_format,
                                    config.max_len, config.device) if config.eval_files else {})
    tracker = RunTracker.attach(home, trained.run_id)
    tracker.log_metrics({f"perplexity_held_out_{_metric_name(name)}": value for name, value in held_out.items()}
                        | {"parameters": float(parameters)})
    tracker.set_tags({BASE_TAG: key[:16]})
    base = Base(key[:16], trained.run_id, str(folder), str(tokenizer), config.dataset, config.model, config.size,
                parameters, config.steps, round((time.monotonic() - started) / 60, 2), trained.utility_valid,
                trained.utility_test, held_out)
    _write_record(home, key, base)
    return base


def _measured_on(home: DataHome, key: str, base: Base, config: PretrainConfig) -> Base:
    """A reused base, with its perplexity on every --eval-file it was not measured on when built (a page
    that starts from it names its own test file); the record keeps the new figures."""
    from uedp.models.checkpoints import checkpoint_kind
    from uedp.models.saving import load_saved

    new = [Path(f) for f in config.eval_files if Path(f).name not in base.held_out]
    if not new:
        return base
    model = load_saved(Path(base.model_folder), checkpoint_kind(Path(base.model_folder)))
    held_out = {**base.held_out, **held_out_perplexity(model, Path(base.tokenizer_folder), new, config.eval_format,
                                                       config.max_len, config.device)}
    measured = replace(base, held_out=held_out)
    _write_record(home, key, measured)
    return measured


def _metric_name(file_name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in file_name)


def _write_record(home: DataHome, key: str, base: Base) -> None:
    path = _record_path(home, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({k: v for k, v in asdict(base).items() if k != "reused"}, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def bases(home: DataHome) -> list[Base]:
    """Every base recorded in the data home whose files are still there, newest first."""
    folder = home.bases_dir
    found = [recorded_base(home, json.loads(p.read_text(encoding="utf-8"))["key"])
             for p in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)] if folder.is_dir() else []
    return [b for b in found if b is not None]
