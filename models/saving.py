"""A trained model as MLflow stores it and attacks, audits and ``--init-from`` load it back.

A fully fine-tuned model is saved whole (``save_pretrained``, or the LSTM's own format). A LoRA model is
saved as its adapter plus ``base.json``: the base checkpoint's identity (folder and content hash), checked
again when it is loaded, so an adapter is never silently put on another base. A base built from a size
preset is not a file anywhere, so its weights are saved beside the adapter, under ``base/``.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from uedp.errors import UedpError
from uedp.models.checkpoints import content_hash
from uedp.models.presets import task_of

ADAPTER_CONFIG = "adapter_config.json"
BASE_FILE = "base.json"
BASE_FOLDER = "base"


@dataclass(frozen=True)
class BaseIdentity:
    """Where a LoRA adapter's frozen base came from: a checkpoint folder, or a preset saved beside it."""

    kind: str  # the model kind (gpt2, llama, causal-lm, ...)
    source: str  # the folder, or "preset <size>"
    content_hash: str = ""  # of the folder (empty for a preset: its weights travel with the adapter)


def save_model(model: torch.nn.Module, tokenizer: Any, folder: Path, base: BaseIdentity | None = None) -> None:
    """The trained model and its tokenizer in ``folder``; a LoRA model as adapter + base identity."""
    from uedp.models.lora import is_lora

    folder.mkdir(parents=True, exist_ok=True)
    if is_lora(model):
        if base is None:
            raise ValueError("a LoRA model is saved with its base checkpoint's identity")
        model.save_pretrained(folder)  # type: ignore[operator]  # peft: the adapter's weights and config only
        (folder / BASE_FILE).write_text(json.dumps(asdict(base), indent=2), encoding="utf-8")
        if not base.content_hash:  # a preset: no folder to name, so its frozen weights travel along
            base_model = model.get_base_model()  # type: ignore[operator]
            base_model.save_pretrained(folder / BASE_FOLDER, state_dict=_without_adapters(base_model.state_dict()))
    else:
        model.save_pretrained(folder)  # type: ignore[operator]
    tokenizer.save_pretrained(folder)


def _without_adapters(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base model's own weights under their own names: peft wraps each adapted layer (its weight becomes
    ``...base_layer.weight``) and a trained head (``...original_module`` beside ``...modules_to_save``)."""
    out = {}
    for name, value in state.items():
        if "lora_" in name or ".modules_to_save." in name:
            continue
        out[name.replace(".base_layer.", ".").replace(".original_module.", ".")] = value
    return out


def load_saved(folder: Path, kind: str) -> torch.nn.Module:
    """A model :func:`save_model` saved (``kind`` as the run's configuration names it): base plus adapter
    for LoRA, after checking the base is the one trained on."""
    if not (folder / ADAPTER_CONFIG).is_file():
        return _load_full(folder, kind)
    from peft import PeftModel

    base_file = folder / BASE_FILE
    if not base_file.is_file():
        raise UedpError(f"{folder}: a LoRA adapter without {BASE_FILE}: its base checkpoint is unknown")
    base = BaseIdentity(**json.loads(base_file.read_text(encoding="utf-8")))
    base_folder = folder / BASE_FOLDER if not base.content_hash else Path(base.source)
    if base.content_hash:
        if not base_folder.is_dir():
            raise UedpError(f"{folder}: the adapter's base checkpoint {base.source} is not on this machine")
        found = content_hash(base_folder)
        if found != base.content_hash:
            raise UedpError(f"{folder}: the adapter was trained on {base.source} with content {base.content_hash}, "
                            f"but that folder now holds {found}; put the original checkpoint back")
    with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return PeftModel.from_pretrained(_load_full(base_folder, base.kind), str(folder))


def saved_form(kind: str) -> str:
    """How a saved model of a configuration's kind loads back: ``gpt2``, ``lstm``, ``classifier`` (any
    sequence classifier, BERT's included) or ``causal-lm`` (any other decoder: the llama preset, a folder)."""
    if kind in ("gpt2", "lstm", "lstm-classifier"):
        return "lstm" if kind.startswith("lstm") else kind  # load_lstm reads either LSTM back
    return "classifier" if task_of(kind) == "classification" else "causal-lm"  # type: ignore[arg-type]


def _load_full(folder: Path, kind: str) -> torch.nn.Module:
    form = saved_form(kind)
    if form == "lstm":
        from uedp.models.lstm import load_lstm

        return load_lstm(folder)
    if form == "gpt2":
        from uedp.models.gpt2 import load_gpt2

        return load_gpt2(folder)
    if form == "classifier":
        from uedp.models.classifier import load_trained_classifier

        return load_trained_classifier(folder)
    from uedp.models.causal_lm import load_causal_lm

    return load_causal_lm(folder)
