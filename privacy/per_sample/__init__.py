"""Clipped sums of per-example gradients, the step DP-SGD's sensitivity rests on: ghost clipping
(:mod:`.ghost`, for the verified architectures: per-layer norms from activations, exact per-layer
fallback by torch.func), each example's own backward pass (:mod:`.exact`, any other model), or Opacus'
materialised per-sample gradients (:mod:`.opacus_path`, when asked for)."""

from __future__ import annotations

import warnings
from typing import Any, Literal, Protocol

import torch
from torch import nn

from uedp.privacy.per_sample.layers import own_parameters

__all__ = ["GHOST_VERIFIED", "Engine", "PerSampleClipping", "ghost_verified", "per_sample_clipping"]

Engine = Literal["ghost", "opacus", "exact"]


class PerSampleClipping(Protocol):
    """``clipped_sum`` returns ``sum_i min(1, clip / ||g_i||) g_i`` per trainable parameter."""

    def clipped_sum(self, loss_fn: Any, inputs: dict[str, torch.Tensor], batch_size: int,
                    clip: float) -> list[torch.Tensor]: ...

    def close(self) -> None: ...


# Model classes whose every layer call was checked to carry the batch in dimension 0 (tests compare each
# example's norm with its own backward pass: tests/test_ghost_clipping.py, tests/test_per_sample_families.py).
# Ghost clipping cannot tell a layer whose dimension 0 only happens to equal the batch size (relative-position
# tables, shared embeddings of other shapes) from a per-example one, so other architectures take the exact path.
GHOST_VERIFIED = frozenset({
    "transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel",
    "transformers.models.bert.modeling_bert.BertForSequenceClassification",
    "transformers.models.llama.modeling_llama.LlamaForCausalLM",
    "transformers.models.qwen2.modeling_qwen2.Qwen2ForCausalLM",
    "transformers.models.mistral.modeling_mistral.MistralForCausalLM",
    "transformers.models.gemma.modeling_gemma.GemmaForCausalLM",
    "transformers.models.gemma2.modeling_gemma2.Gemma2ForCausalLM",
    "transformers.models.gemma3.modeling_gemma3.Gemma3ForCausalLM",
    "uedp.models.lstm.LstmLanguageModel",
})

# The layers a peft (LoRA) adapter adds and trains: ``nn.Linear`` modules in its ``lora_A`` / ``lora_B``
# ModuleDicts, applied to the wrapped layer's input; and ``modules_to_save``, trainable copies of the base's
# own layers called in their place (a classifier's new head). Any other trainable module in an adapted model
# (LoRA on an embedding, DoRA's magnitude, prompt encoders) is not verified.
_LORA_CONTAINERS = frozenset({"lora_A", "lora_B"})
_COPIES = "modules_to_save"


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _adapted_base(model: nn.Module) -> nn.Module | None:
    """The model a peft ``PeftModel`` wraps (duck-typed: no peft import), None for a plain model."""
    get_base_model = getattr(model, "get_base_model", None)
    base = get_base_model() if callable(get_base_model) and hasattr(model, "peft_config") else None
    return base if isinstance(base, nn.Module) and base is not model else None


def _verified_adapter_layer(name: str, module: nn.Module) -> bool:
    parts = name.split(".")
    lora = type(module) is nn.Linear and len(parts) >= 2 and parts[-2] in _LORA_CONTAINERS
    return lora or _COPIES in parts


def _described(model: nn.Module) -> str:
    base = _adapted_base(model)
    return type(model).__name__ + (f" around {type(base).__name__}" if base is not None else "")


def ghost_verified(model: nn.Module) -> bool:
    """A verified class; or a peft model around one whose every module with trainable parameters of its
    own is a LoRA ``lora_A`` / ``lora_B`` linear layer or a trainable copy of one of the base's layers (the
    frozen base needs no per-example gradient)."""
    base = _adapted_base(model)
    if base is None:
        return _qualified(type(model)) in GHOST_VERIFIED
    return _qualified(type(base)) in GHOST_VERIFIED and all(
        _verified_adapter_layer(name, module) for name, module in model.named_modules() if own_parameters(module))


def per_sample_clipping(model: nn.Module, engine: Engine = "ghost",
                        loss_reduction: Literal["mean", "sum"] = "mean") -> PerSampleClipping:
    """``ghost`` for the verified models, each example's own backward pass for any other (with a warning) or
    when asked for (``exact``), Opacus' path when asked for."""
    if engine == "ghost" and ghost_verified(model):
        from uedp.privacy.per_sample.ghost import GhostClipping

        return GhostClipping(model, loss_reduction)
    if engine == "ghost":
        warnings.warn(f"ghost clipping is not verified for {_described(model)}: per-example gradients by each "
                      "example's own backward pass (exact, slower)", stacklevel=2)
        engine = "exact"
    if engine == "exact":
        from uedp.privacy.per_sample.exact import ExactClipping

        return ExactClipping(model, loss_reduction)
    if engine == "opacus":
        from uedp.privacy.per_sample.opacus_path import OpacusClipping

        return OpacusClipping(model, loss_reduction)
    raise ValueError(f"unknown per-example gradient engine {engine!r}; valid: ghost, exact, opacus")
