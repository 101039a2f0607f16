"""Per-layer rules: from what a layer saw in the forward pass (its inputs) and the gradient of the loss
at its output, the factors of each of its parameters' per-example gradients (:mod:`.factors`).

Rules are registered by the layer's class under the class's qualified name, which keeps this module free
of a transformers import. A subclass inherits its base class's rule only if it does not override
``forward`` (Opacus' ``RNNLinear`` does not); one that does computes something else (Gemma's scaled word
embedding multiplies the lookup by ``embed_scale``), so the base rule would give wrong per-example
gradients. A layer with trainable parameters and no rule gets :func:`per_sample_by_functorch`:
its per-example gradients are materialised with ``torch.func`` (exact, slower, more memory), so ghost
clipping covers any model and is fast where a rule exists.

Every rule sees the batch in dimension 0 of the layer's input and output; tokens, time steps and any
other dimensions between batch and features are flattened into one token axis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vjp, vmap

from uedp.privacy.per_sample.factors import Dense, Factor, Outer

__all__ = ["Rule", "own_parameters", "per_sample_by_functorch", "register_rule", "rule_for", "rule_name"]

# (layer, positional inputs, keyword inputs, gradient at the output) -> factors of its trainable parameters
Rule = Callable[[nn.Module, tuple[Any, ...], dict[str, Any], torch.Tensor], dict[nn.Parameter, Factor]]

_RULES: dict[str, Rule] = {}


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_rule(*class_names: str) -> Callable[[Rule], Rule]:
    """Register a rule for layers of these classes (``"package.module.Class"``)."""
    def decorate(rule: Rule) -> Rule:
        for name in class_names:
            _RULES[name] = rule
        return rule
    return decorate


def rule_for(module: nn.Module) -> Rule:
    """The registered rule of the module's class, or of the nearest base class whose ``forward`` the
    classes in between inherit unchanged; else the ``torch.func`` path (exact for any layer)."""
    for cls in type(module).__mro__:
        if (rule := _RULES.get(_qualified(cls))) is not None:
            return rule
        if "forward" in vars(cls):  # computes its own function: a base class's rule would not describe it
            break
    return per_sample_by_functorch


def rule_name(module: nn.Module) -> str:
    """``"ghost"`` where a factored rule covers the layer, ``"materialised"`` where torch.func does."""
    return "materialised" if rule_for(module) is per_sample_by_functorch else "ghost"


def own_parameters(module: nn.Module) -> dict[str, nn.Parameter]:
    """The trainable parameters a module uses itself: registered on it and not also a parameter of one of
    its submodules (Opacus' ``DPLSTM`` registers its cells' weights again under ``nn.LSTM``'s names; those
    belong to the cells' linear layers, and counting them twice would double their gradient)."""
    inner = {id(p) for child in module.children() for p in child.parameters()}
    return {name: p for name, p in module.named_parameters(recurse=False) if p.requires_grad and id(p) not in inner}


def _tokens(tensor: torch.Tensor) -> torch.Tensor:
    """(B, ..., d) -> (B, T, d), T the product of the middle dimensions (1 for a (B, d) input)."""
    return tensor.reshape(tensor.shape[0], -1, tensor.shape[-1])


def _trainable(param: object) -> TypeGuard[nn.Parameter]:
    return isinstance(param, nn.Parameter) and param.requires_grad


def _bias(module: nn.Module, grad: torch.Tensor) -> dict[nn.Parameter, Factor]:
    bias = getattr(module, "bias", None)
    return {bias: Dense(grad.sum(dim=1))} if _trainable(bias) else {}


def _affine(module: nn.Module, x: torch.Tensor, grad: torch.Tensor, output_rows: bool) -> dict[nn.Parameter, Factor]:
    """An affine layer's weight as one outer product per token, the output side first when the weight's
    rows are outputs (``Linear``: W is (out, in)) or second when they are inputs (``Conv1D``: (in, out))."""
    x, g = _tokens(x), _tokens(grad)
    out: dict[nn.Parameter, Factor] = _bias(module, g)
    weight = getattr(module, "weight", None)
    if _trainable(weight):
        out[weight] = Outer(g, x, g.shape[-1]) if output_rows else Outer(x, g, x.shape[-1])
    return out


@register_rule("torch.nn.modules.linear.Linear")
def linear(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor) -> dict[nn.Parameter, Factor]:
    """``y = x W^T + b``, W (out, in): ``G_i = sum_t g_it (x) x_it``."""
    return _affine(module, args[0], grad, output_rows=True)


@register_rule("transformers.pytorch_utils.Conv1D")
def conv1d_transposed_linear(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                             grad: torch.Tensor) -> dict[nn.Parameter, Factor]:
    """GPT-2's ``Conv1D``: ``y = x W + b``, W (in, out): ``G_i = sum_t x_it (x) g_it``."""
    return _affine(module, args[0], grad, output_rows=False)


@register_rule("torch.nn.modules.sparse.Embedding")
def embedding(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor) -> dict[nn.Parameter, Factor]:
    """A lookup: row ``id`` of the gradient gathers the output gradients of the tokens with that id; the
    padding index, which PyTorch never updates, gets nothing."""
    return _lookup(module, args, kwargs, grad, scale=None)


# Gemma's input embedding: ``nn.Embedding.forward(ids) * embed_scale`` (sqrt(hidden) in the weight's dtype).
@register_rule("transformers.models.gemma.modeling_gemma.GemmaTextScaledWordEmbedding",
               "transformers.models.gemma2.modeling_gemma2.Gemma2TextScaledWordEmbedding",
               "transformers.models.gemma3.modeling_gemma3.Gemma3TextScaledWordEmbedding")
def scaled_embedding(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                     grad: torch.Tensor) -> dict[nn.Parameter, Factor]:
    """A lookup times a constant: the plain lookup's rule with the output gradient times ``embed_scale``
    (as the forward pass rounds it, to the weight's dtype); without it a norm would be off by that scale."""
    assert isinstance(module, nn.Embedding)
    scale = getattr(module, "embed_scale", None)
    if not isinstance(scale, torch.Tensor) or scale.numel() != 1:
        return per_sample_by_functorch(module, args, kwargs, grad)
    return _lookup(module, args, kwargs, grad, scale=scale.detach().to(module.weight.dtype))


def _lookup(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor,
            scale: torch.Tensor | None) -> dict[nn.Parameter, Factor]:
    assert isinstance(module, nn.Embedding)
    if module.max_norm is not None or module.scale_grad_by_freq or module.sparse:
        return per_sample_by_functorch(module, args, kwargs, grad)
    weight = module.weight
    if not _trainable(weight):
        return {}
    ids = args[0].reshape(args[0].shape[0], -1)
    g = grad.reshape(ids.shape[0], ids.shape[1], -1)
    if scale is not None:
        g = g * scale.to(device=g.device, dtype=g.dtype)
    if module.padding_idx is not None:
        g = torch.where((ids == module.padding_idx)[..., None], 0.0, g)
    return {weight: Outer(ids, g, module.num_embeddings, one_hot=True)}


@register_rule("torch.nn.modules.normalization.LayerNorm")
def layer_norm(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor) -> dict[nn.Parameter, Factor]:
    """``y = x_hat * w + b`` over the last dimension: small per-example gradients, kept as they are."""
    assert isinstance(module, nn.LayerNorm)
    if len(module.normalized_shape) != 1:
        return per_sample_by_functorch(module, args, kwargs, grad)
    x, g = _tokens(args[0]), _tokens(grad)
    out: dict[nn.Parameter, Factor] = _bias(module, g)
    weight = module.weight
    if _trainable(weight):
        normalized = F.layer_norm(x, module.normalized_shape, eps=module.eps)
        out[weight] = Dense((g * normalized).sum(dim=1))
    return out


# y = w * x_hat (Llama, Qwen2, Mistral: x_hat rounded to the input's dtype first) or x_hat * (1 + w) (Gemma,
# in float32), x_hat = x / sqrt(mean(x^2) + eps) over the last dimension, computed in float32 by both: either
# way dy/dw = x_hat.
@register_rule("transformers.models.llama.modeling_llama.LlamaRMSNorm",
               "transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm",
               "transformers.models.mistral.modeling_mistral.MistralRMSNorm")
def rms_norm(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor) -> dict[nn.Parameter, Factor]:
    """``w * x_hat``: per-example gradient ``sum_t g_t * x_hat_t``, small (the width), kept as it is."""
    return _rms_norm(module, args, kwargs, grad, getattr(module, "variance_epsilon", None))


@register_rule("transformers.models.gemma.modeling_gemma.GemmaRMSNorm",
               "transformers.models.gemma2.modeling_gemma2.Gemma2RMSNorm",
               "transformers.models.gemma3.modeling_gemma3.Gemma3RMSNorm")
def rms_norm_plus_one(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                      grad: torch.Tensor) -> dict[nn.Parameter, Factor]:
    """``x_hat * (1 + w)``: the same gradient as ``w * x_hat``."""
    return _rms_norm(module, args, kwargs, grad, getattr(module, "eps", None))


def _rms_norm(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grad: torch.Tensor,
              eps: object) -> dict[nn.Parameter, Factor]:
    """The rule where the layer is the one it was written for (one positional input, a vector weight, a
    float epsilon), else the exact fallback."""
    weight = getattr(module, "weight", None)
    if not _trainable(weight):
        return {}
    x = args[0] if len(args) == 1 and not kwargs else None
    if not isinstance(x, torch.Tensor) or not isinstance(eps, float) or weight.shape != x.shape[-1:]:
        return per_sample_by_functorch(module, args, kwargs, grad)
    x, g = _tokens(x).float(), _tokens(grad)  # both layers normalise in float32, whatever their dtype
    normalized = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return {weight: Dense((g * normalized.to(g.dtype)).sum(dim=1))}


def per_sample_by_functorch(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                            grad: torch.Tensor) -> dict[nn.Parameter, Factor]:
    """The exact fallback: each example's gradient of the layer's own parameters, materialised with
    ``vmap`` over a vector-Jacobian product of the layer applied to that example alone.

    Tensor inputs are split along dimension 0; keyword inputs must not be tensors (they would be
    shared by all examples, which a per-example split cannot know to be right)."""
    own = own_parameters(module)
    if not own:
        return {}
    if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        raise ValueError(f"no per-example gradient rule for {type(module).__name__} called with tensor keyword "
                         "arguments; use per_sample='opacus'")
    detached = {name: p.detach() for name, p in own.items()}
    dims = tuple(0 if isinstance(a, torch.Tensor) else None for a in args)

    def one_example(example_args: tuple[Any, ...], example_grad: torch.Tensor) -> dict[str, torch.Tensor]:
        inputs = tuple(a.unsqueeze(0) if isinstance(a, torch.Tensor) else a for a in example_args)
        pullback = vjp(lambda params: functional_call(module, params, inputs, kwargs), detached)[1]
        grads: dict[str, torch.Tensor] = pullback(example_grad.unsqueeze(0))[0]
        return grads

    detached_args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    per_example = vmap(one_example, in_dims=(dims, 0))(detached_args, grad)
    return {own[name]: Dense(per_example[name]) for name in own}
