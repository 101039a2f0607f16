"""The model a run starts from: a preset built from scratch, a checkpoint folder, or (``--init-from``) the
model a finished run logged; with LoRA adapters when asked; and what the privacy statement says about it.

Whatever the starting weights saw is outside the run's epsilon, so the statement names them as public: the
checkpoint folder and its content hash, or the run and the dataset it trained on. Starting from a run on
this same dataset would carry that dataset into the model outside epsilon, so it is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from uedp.errors import UedpError
from uedp.models.checkpoints import content_hash, is_checkpoint_folder
from uedp.models.factory import build_model, check_vocabulary
from uedp.models.presets import SIZE_PRESETS, task_of
from uedp.models.saving import ADAPTER_CONFIG, BaseIdentity, load_saved
from uedp.services.config import TrainConfig
from uedp.storage.home import DataHome

INIT_RUN_FILE = "init_run.json"


@dataclass(frozen=True)
class Start:
    """Where a run's weights and tokenizer come from, resolved before any data is read."""

    tokenizer: str  # "byte" or a folder / name for ``load_tokenizer``
    folder: Path | None = None  # the checkpoint or downloaded run model the weights load from; None: a preset
    kind: str = ""  # how ``folder`` loads (the model kind it was saved as)
    public: tuple[str, ...] = field(default_factory=tuple)  # what the statement names as public


def init_folder(home: DataHome, run_id: str) -> Path:
    """The model run ``run_id`` logged, downloaded once into the data home (``init/<run_id>``)."""
    folder = home.root / "init" / run_id
    if folder.is_dir():
        return folder
    from uedp.services.tracking import RunTracker

    tracker = RunTracker.attach(home, run_id)
    tracker.require_run()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:  # nothing half-downloaded is ever used
        model = tracker.download("model", Path(tmp))
        config = tracker.download("resolved_config.json", Path(tmp))
        if model is None or config is None:
            raise UedpError(f"--init-from {run_id}: the run logged no model; train it with --log-model")
        shutil.move(str(config), model / "resolved_config.json")
        tags = tracker.client.get_run(run_id).data.tags
        (model / INIT_RUN_FILE).write_text(json.dumps({"run_id": run_id, "dataset_id": tags.get("uedp.dataset_id")}),
                                          encoding="utf-8")
        os.replace(model, folder)
    return folder


def resolve_start(home: DataHome, config: TrainConfig, dataset_id: str) -> Start:
    """The weights and tokenizer a configuration starts from, after the checks ``--init-from`` needs
    (``dataset_id``: this run's dataset's keyed content id, which a run on the same text under another
    name shares)."""
    if config.init_from is None:
        if config.model_size in SIZE_PRESETS[config.model]:
            return Start(config.tokenizer)
        folder = Path(config.model_size)
        public = (_checkpoint_public(folder),) if is_checkpoint_folder(folder) else ()
        return Start(config.tokenizer, folder if public else None, config.model, public)
    if is_checkpoint_folder(config.init_from):  # a folder someone else trained
        folder = Path(config.init_from)
        return Start(str(folder), folder, config.model, (_checkpoint_public(folder),))
    folder = init_folder(home, config.init_from)
    logged = json.loads((folder / "resolved_config.json").read_text(encoding="utf-8"))
    init = TrainConfig.from_logged(logged["config"])
    init_run = json.loads((folder / INIT_RUN_FILE).read_text(encoding="utf-8"))
    if init.dataset == config.dataset or init_run.get("dataset_id") == dataset_id:
        raise UedpError(f"--init-from {config.init_from}: that run trained on {init.dataset!r}, the text this run "
                        f"protects ({config.dataset!r}); its model would carry that text outside epsilon. Start from "
                        "a run on public text")
    if task_of(init.model) != config.task:
        raise UedpError(f"--init-from {config.init_from}: that run trained a {task_of(init.model)} model, this run a "
                        f"{config.task} model")
    prefix = "the initial model: "
    earlier = [p.removeprefix(prefix) for p in logged.get("privacy", {}).get("public", ()) if p.startswith(prefix)]
    public = (f"{prefix}run {config.init_from} ({init.mechanism} on dataset {init.dataset!r}, whose text is treated "
              f"as public{'; it started from ' + earlier[0] if earlier else ''})",)
    return Start(str(folder), folder, init.model, public)


def _checkpoint_public(folder: Path) -> str:
    return f"the initial model: checkpoint {folder.resolve()} ({content_hash(folder)}) and whatever it was trained on"


def start_model(config: TrainConfig, start: Start, tokenizer: Any, num_labels: int | None) -> torch.nn.Module:
    """The starting model, LoRA adapters added when ``lora_rank`` is set and gradient checkpointing on
    when asked."""
    if start.folder is None or config.init_from is None:
        model = build_model(config.model, config.model_size, tokenizer, num_labels)
    else:
        model = load_saved(start.folder, start.kind)
        if (start.folder / ADAPTER_CONFIG).is_file():
            model = model.merge_and_unload()  # type: ignore[operator]  # peft: the adapted weights as plain ones
        check_vocabulary(model, tokenizer, str(start.folder))
    if config.gradient_checkpointing:
        if not hasattr(model, "gradient_checkpointing_enable"):
            raise UedpError(f"gradient checkpointing is for Hugging Face transformers models, not {config.model}")
        # non-reentrant: the kind ghost clipping's hooks see (the reentrant kind is refused by it)
        model.gradient_checkpointing_enable(  # type: ignore[operator]  # a transformers method torch's typing hides
            gradient_checkpointing_kwargs={"use_reentrant": False})
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
        kind = start.kind if config.init_from is not None else config.model
        return BaseIdentity(kind, str(folder.resolve()), content_hash(folder))
    return BaseIdentity(_saved_kind(config, start), f"preset {config.model_size}" if folder is None else str(folder))


def _saved_kind(config: TrainConfig, start: Start) -> str:
    """How a base saved beside its adapter loads back: GPT-2s as GPT-2, classifiers as classifiers, any
    other decoder (the llama preset, a merged init model) as a causal LM."""
    kind = start.kind or config.model
    if kind in ("gpt2", "lstm"):
        return kind
    return "classifier" if task_of(config.model) == "classification" else "causal-lm"
