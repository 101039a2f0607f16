"""LoRA adapters (peft): only the low-rank pair added to the chosen Linear layers trains; the checkpoint's
own weights stay frozen. DP-SGD's clipping and noise, userdp's deltas and resumable checkpoints all work on
the trainable parameters, so under LoRA they cover the adapters only.

LoRA's own dropout is always 0: its masks would come from torch's global generator, shared by every unit of
a private run (``privacy.layer_randomness``)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PreTrainedModel

from uedp.errors import UedpError


@dataclass(frozen=True)
class LoraSettings:
    """``rank`` r of the adapters, their scale ``alpha`` (the update is ``alpha / r * B A``) and the names of
    the layers they adapt (empty: peft's default for the architecture, e.g. q_proj and v_proj for Llama)."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = ()


def with_lora(model: torch.nn.Module, settings: LoraSettings, classifier: bool = False) -> PeftModel:
    """``model`` with LoRA adapters; every other weight frozen (a classifier's new head trains too)."""
    if not isinstance(model, PreTrainedModel):
        raise UedpError(f"LoRA adapts Hugging Face transformers models, not {type(model).__name__}")
    config = LoraConfig(r=settings.rank,
                        lora_alpha=settings.alpha,  # type: ignore[arg-type]  # peft annotates int; any number scales
                        lora_dropout=0.0, target_modules=list(settings.targets) or None,
                        task_type="SEQ_CLS" if classifier else "CAUSAL_LM")
    try:
        with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return get_peft_model(model, config)
    except ValueError as exc:  # peft: no default targets for this architecture, or a target not in the model
        raise UedpError(f"--lora-rank: {str(exc).splitlines()[0]} (name the layers with --lora-targets, "
                        "e.g. q_proj,v_proj)") from None


def is_lora(model: torch.nn.Module) -> bool:
    return isinstance(model, PeftModel)


def trainable_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
