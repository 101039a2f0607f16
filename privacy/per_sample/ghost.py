"""Ghost clipping: ``sum_i clip(g_i)`` for DP-SGD at close to the cost and memory of one ordinary step.

One forward pass records, for every layer with trainable parameters, its inputs, and a hook on its
output records the gradient arriving there. One backward pass then runs to the layers' outputs only:
PyTorch skips every weight gradient, since none is asked for. From inputs and output gradients each
layer's rule (:mod:`.layers`) gives its parameters' per-example gradients in factored form
(:mod:`.factors`); per parameter, the per-example squared norms come either from Gram matrices (ghost
norms: nothing of the parameter's size is formed per example) or from the per-example gradients
materialised and kept, whichever costs fewer multiply-adds within a memory cap (the mixed strategy of
Bu et al. 2023). The clip factors ``c_i = min(1, C / ||g_i||)`` then weight one product per layer,
``(c * left)^T right``, which is the clipped sum.

Flat clipping over all trainable parameters, as DP-SGD's sensitivity analysis assumes: ``||g_i||`` is
the norm of example i's whole gradient, with a shared parameter's uses added before the norm is taken
(GPT-2's tied embedding: see :mod:`.factors`). An example whose norm is not finite counts 0.

The hooks stay on the model until :meth:`GhostClipping.close`; they record nothing outside
:meth:`GhostClipping.clipped_sum`, so evaluating the model in between costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from uedp.privacy.per_sample.factors import Dense, Factor, Outer
from uedp.privacy.per_sample.layers import Rule, own_parameters, rule_for

__all__ = ["GhostClipping", "Strategy"]

# "auto": per parameter, ghost norms or materialised per-example gradients, whichever is cheaper within
# the memory cap; the other two force one (tests, benchmarks).
Strategy = Literal["auto", "ghost", "materialise"]
Loss = Any  # a callable (model, inputs) -> scalar tensor; kept loose to avoid a models import cycle


@dataclass
class _Call:
    """One application of a layer during the recorded forward pass."""

    module: nn.Module
    rule: Rule
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: torch.Tensor | None
    version: int  # the output's version when recorded: a later in-place change would hide its gradient
    # Where the layer's tensor inputs come from in the autograd graph (a node, or a leaf tensor): the
    # check that no trainable parameter reaches the loss except through a recorded call resumes there.
    sources: list[Any] = field(default_factory=list)
    grad: torch.Tensor | None = field(default=None)


def _compute(value: Any) -> Any:
    """Detached, and at least float32 when floating (autocast may have run the layer in bf16)."""
    if not isinstance(value, torch.Tensor):
        return value
    value = value.detach()
    return value.to(torch.promote_types(value.dtype, torch.float32)) if value.is_floating_point() else value


class GhostClipping:
    """Clipped per-example gradient sums of ``model``'s trainable parameters."""

    def __init__(self, model: nn.Module, loss_reduction: Literal["mean", "sum"] = "mean",
                 strategy: Strategy = "auto", materialise_bytes: int = 64 << 20):
        self.model = model
        self.loss_reduction = loss_reduction
        self.strategy: Strategy = strategy
        self.materialise_bytes = materialise_bytes  # per parameter: B * numel * 4 at most
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._calls: list[_Call] | None = None
        self._rules = {module: rule_for(module) for module in model.modules() if own_parameters(module)}
        self._handles = [module.register_forward_hook(self._record, with_kwargs=True) for module in self._rules]

    def close(self) -> None:
        """Remove the hooks: the model is a plain model again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _record(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if self._calls is None:
            return
        if not isinstance(output, torch.Tensor):  # its parameters' gradients would silently be left out
            raise ValueError(f"ghost clipping has no per-example rule for {type(module).__name__}, whose output is "
                             "not one tensor; use per_sample='opacus'")
        if not torch.is_grad_enabled():  # reentrant checkpointing: the gradient comes from a recomputation
            raise ValueError(f"{type(module).__name__} ran without autograd inside the loss (reentrant activation "
                             "checkpointing?): ghost clipping cannot see its parameters' gradient")
        if not output.requires_grad:
            return
        call = _Call(module, self._rules[module], tuple(_compute(a) for a in args),
                     {k: _compute(v) for k, v in kwargs.items()}, output, output._version,
                     [_source(t) for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.requires_grad])

        def keep(grad: torch.Tensor) -> None:
            call.grad = grad.detach() if call.grad is None else call.grad + grad.detach()
        output.register_hook(keep)  # type: ignore[no-untyped-call]
        self._calls.append(call)

    def clipped_sum(self, loss_fn: Loss, inputs: dict[str, torch.Tensor], batch_size: int,
                    clip: float) -> list[torch.Tensor]:
        """``sum_i min(1, clip / ||g_i||) g_i`` per trainable parameter, ``g_i`` the gradient of example i's loss.

        ``loss_fn(model, inputs)`` must be the mean (``loss_reduction="mean"``) or the sum of per-example
        losses over the ``batch_size`` rows of ``inputs``."""
        factors = self._recorded_factors(loss_fn, inputs, batch_size)
        norms, kept = self._norms(factors, batch_size)
        return self._clipped_sums(factors, kept, norms, batch_size, clip)

    def per_example_norms(self, loss_fn: Loss, inputs: dict[str, torch.Tensor], batch_size: int) -> torch.Tensor:
        """``||g_i||`` over all trainable parameters, per example (float64): what clipping divides by."""
        return self._norms(self._recorded_factors(loss_fn, inputs, batch_size), batch_size)[0]

    def _recorded_factors(self, loss_fn: Loss, inputs: dict[str, torch.Tensor],
                          batch_size: int) -> dict[nn.Parameter, list[Factor]]:
        """One forward pass with the layers recorded, one backward pass to their outputs, the factors."""
        self._calls = []
        try:
            loss = loss_fn(self.model, inputs)
            calls = self._calls
        finally:
            self._calls = None
        scale = float(batch_size) if self.loss_reduction == "mean" else 1.0
        for call in calls:
            if call.output is not None and call.output._version != call.version:
                raise ValueError(f"the output of {type(call.module).__name__} was changed in place after the layer; "
                                 "ghost clipping cannot see its gradient: use per_sample='opacus'")
        self._check_every_use_recorded(loss, calls)
        if calls:  # backward to the layers' outputs only (the hooks keep each gradient): no weight gradient
            torch.autograd.grad(loss * scale, [c.output for c in calls if c.output is not None], allow_unused=True)
        for call in calls:
            call.output, call.sources = None, []
        return self._factors(calls, batch_size)

    def _check_every_use_recorded(self, loss: torch.Tensor, calls: list[_Call]) -> None:
        """Refuse a trainable parameter that reaches the loss other than inside a recorded call of a layer
        that owns it (peft's LoRA embedding reads its ``ParameterDict`` directly; a parent module could use
        a child's weight): no rule sees that use, so its gradient would silently be zero or incomplete.

        Walks the loss's autograd graph (a few milliseconds, whatever the width), jumping over each recorded
        call from its output to its inputs. What happens inside a call is not walked: a layer that used a
        parameter it does not own (none in the verified models) would not be caught here."""
        names = {id(p): name for name, p in self.model.named_parameters() if p.requires_grad}
        layer_outputs: dict[Any, list[_Call]] = {}
        for call in calls:
            if call.output is not None and call.output.grad_fn is not None:
                layer_outputs.setdefault(call.output.grad_fn, []).append(call)
        unseen = sorted({names[id(t)] for t in _leaves_outside(loss.grad_fn, layer_outputs) if id(t) in names})
        if unseen:
            raise ValueError(f"trainable parameters reach the loss outside the layers that own them ({', '.join(unseen)}): "
                             "ghost clipping cannot see their gradient; use the exact path (privacy.per_sample.exact)")

    def _factors(self, calls: list[_Call], batch_size: int) -> dict[nn.Parameter, list[Factor]]:
        out: dict[nn.Parameter, list[Factor]] = {}
        for call in calls:
            if call.grad is None:  # this output did not reach the loss
                continue
            grad = _compute(call.grad)
            _check_batch(call, grad, batch_size)
            for param, factor in call.rule(call.module, call.args, call.kwargs, grad).items():
                out.setdefault(param, []).append(factor)
        return {param: _merged(factors) for param, factors in out.items()}

    def _materialise(self, param: nn.Parameter, factors: list[Factor]) -> bool:
        if any(isinstance(f, Dense) for f in factors) or self.strategy == "materialise":
            return True
        if self.strategy == "ghost":
            return False
        outers = [f for f in factors if isinstance(f, Outer)]
        fits = outers[0].batch * param.numel() * 4 <= self.materialise_bytes
        ghost = sum(a.ghost_cost(b) for a in outers for b in outers)
        return fits and sum(f.materialise_cost() for f in outers) <= 2 * ghost  # Gram products run slower per flop

    def _norms(self, factors: dict[nn.Parameter, list[Factor]],
               batch_size: int) -> tuple[torch.Tensor, dict[nn.Parameter, torch.Tensor]]:
        """Per-example norms, and the per-example gradients of the parameters materialised on the way."""
        device = self.params[0].device if self.params else torch.device("cpu")
        squared = torch.zeros(batch_size, dtype=torch.float64, device=device)
        kept: dict[nn.Parameter, torch.Tensor] = {}
        for param, param_factors in factors.items():
            if self._materialise(param, param_factors):
                per_example = _total(f.materialise() for f in param_factors)
                kept[param] = per_example
                flat = per_example.reshape(batch_size, 1, -1)
                squared += torch.bmm(flat, flat.transpose(1, 2)).reshape(-1).double()  # a GEMV per example, not pow + sum
            else:
                outers = [f for f in param_factors if isinstance(f, Outer)]
                for i, a in enumerate(outers):
                    squared += a.inner(a).double()
                    for b in outers[i + 1:]:  # a shared parameter's uses: the cross terms
                        squared += 2 * a.inner(b).double()
        return squared.clamp(min=0).sqrt(), kept

    def _clipped_sums(self, factors: dict[nn.Parameter, list[Factor]], kept: dict[nn.Parameter, torch.Tensor],
                      norms: torch.Tensor, batch_size: int, clip: float) -> list[torch.Tensor]:
        finite = torch.isfinite(norms)
        scale = torch.where(finite, torch.clamp(clip / (norms + 1e-12), max=1.0), 0.0)
        dropped = None if bool(finite.all()) else ~finite
        sums = []
        for param in self.params:
            if param in kept:
                per_example = kept[param] if dropped is None else Dense(kept[param]).without(dropped).per_sample
                weights = scale.to(per_example.dtype)
                sums.append((weights @ per_example.reshape(batch_size, -1)).view_as(param).to(param.dtype))
            elif param in factors:
                outers = [f if dropped is None else f.without(dropped)
                          for f in factors[param] if isinstance(f, Outer)]
                sums.append(_total(f.weighted_sum(scale.to(f.right.dtype)) for f in outers).to(param.dtype))
            else:  # not used by this batch's loss: every example's gradient is zero
                sums.append(torch.zeros_like(param))
        return sums


def _merged(factors: list[Factor]) -> list[Factor]:
    """One factor per kind: uses of a layer with dense sides concatenated along tokens, one-hot uses
    likewise, per-example gradients added."""
    dense = [f for f in factors if isinstance(f, Dense)]
    merged: list[Factor] = [Dense(_total(f.per_sample for f in dense))] if dense else []
    for one_hot in (False, True):
        outers = [f for f in factors if isinstance(f, Outer) and f.one_hot == one_hot]
        if outers:
            first = outers[0]
            for other in outers[1:]:
                first = first.concat(other)
            merged.append(first)
    return merged


def _total(tensors: Any) -> torch.Tensor:
    iterator = iter(tensors)
    total: torch.Tensor = next(iterator)
    for tensor in iterator:
        total = total + tensor
    return total


def _source(tensor: torch.Tensor) -> Any:
    """The autograd node a layer input comes from, or the tensor itself when it is a leaf."""
    return tensor.grad_fn if tensor.grad_fn is not None else tensor


def _leaves_outside(root: Any, layer_outputs: dict[Any, list[_Call]]) -> list[torch.Tensor]:
    """The leaf tensors the graph from ``root`` accumulates into, not counting paths inside recorded calls."""
    leaves: list[torch.Tensor] = []
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, torch.Tensor):  # a leaf passed straight into a layer
            leaves.append(node)
            continue
        sources = [s for call in layer_outputs.get(node, []) for s in call.sources]
        if node in layer_outputs and not any(s is node for s in sources):  # a layer that returns its input is no jump
            stack.extend(sources)
        elif hasattr(node, "variable"):  # AccumulateGrad: a leaf used here
            leaves.append(node.variable)
        else:
            stack.extend(next_node for next_node, _ in node.next_functions)
    return leaves


def _check_batch(call: _Call, grad: torch.Tensor, batch_size: int) -> None:
    first = next((a for a in call.args if isinstance(a, torch.Tensor)), None)
    for what, tensor in (("input", first), ("output", grad)):
        if tensor is not None and (tensor.dim() == 0 or tensor.shape[0] != batch_size):
            raise ValueError(
                f"per-example gradients need the batch in dimension 0 of every layer's {what}: "
                f"{type(call.module).__name__} got {tuple(tensor.shape)} for a batch of {batch_size} "
                "(pass per-row position ids, as models.metrics' losses do)")
