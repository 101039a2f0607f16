"""Clipped sums of per-example gradients, the step DP-SGD's sensitivity rests on: ghost clipping
(:mod:`.ghost`, the default: per-layer norms from activations, exact per-layer fallback by torch.func)
or Opacus' materialised per-sample gradients (:mod:`.opacus_path`)."""

from __future__ import annotations

import warnings
from typing import Any, Literal, Protocol

import torch
from torch import nn

__all__ = ["Engine", "PerSampleClipping", "per_sample_clipping"]

Engine = Literal["ghost", "opacus"]


class PerSampleClipping(Protocol):
    """``clipped_sum`` returns ``sum_i min(1, clip / ||g_i||) g_i`` per trainable parameter."""

    def clipped_sum(self, loss_fn: Any, inputs: dict[str, torch.Tensor], batch_size: int,
                    clip: float) -> list[torch.Tensor]: ...

    def close(self) -> None: ...


# Model classes whose every layer call was checked to carry the batch in dimension 0 (tests compare each
# example's norm with its own backward pass). Ghost clipping cannot tell a layer whose dimension 0 only
# happens to equal the batch size (relative-position tables, shared embeddings of other shapes) from a
# per-example one, so other architectures (any checkpoint `load_classifier` accepts) take Opacus' path.
GHOST_VERIFIED = frozenset({
    "transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel",
    "transformers.models.bert.modeling_bert.BertForSequenceClassification",
    "uedp.models.lstm.LstmLanguageModel",
})


def ghost_verified(model: nn.Module) -> bool:
    return f"{type(model).__module__}.{type(model).__qualname__}" in GHOST_VERIFIED


def per_sample_clipping(model: nn.Module, engine: Engine = "ghost",
                        loss_reduction: Literal["mean", "sum"] = "mean") -> PerSampleClipping:
    """``ghost`` for the verified model classes, Opacus' path for any other model (with a warning) or
    when asked for."""
    if engine == "ghost" and ghost_verified(model):
        from uedp.privacy.per_sample.ghost import GhostClipping

        return GhostClipping(model, loss_reduction)
    if engine == "ghost":
        warnings.warn(f"ghost clipping is verified for GPT-2, BERT classifiers and the LSTM, not "
                      f"{type(model).__name__}: using Opacus' per-sample gradients", stacklevel=2)
        engine = "opacus"
    if engine == "opacus":
        from uedp.privacy.per_sample.opacus_path import OpacusClipping

        return OpacusClipping(model, loss_reduction)
    raise ValueError(f"unknown per-example gradient engine {engine!r}; valid: ghost, opacus")
