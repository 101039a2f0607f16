"""Device choice: CUDA when present (bf16 autocast there), else CPU; overridable by the user. And the
training forward pass' precision: bf16 autocast on CUDA by default, on a CPU when a run asks for it."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

from uedp.errors import UedpError
from uedp.models.presets import Precision


def resolve_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise UedpError(f"invalid device {requested!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UedpError(f"device {requested!r} requested but CUDA is not available on this machine")
    return device


# The precision the training steps of this context run their forward passes in (TrainConfig.precision). A context
# variable rather than an argument: the steps sit inside every mechanism's loop, and a run sets it once around
# its training (training_precision); a thread or task of another run keeps its own.
_PRECISION: contextvars.ContextVar[Precision] = contextvars.ContextVar("uedp_training_precision", default="auto")


@contextlib.contextmanager
def training_precision(precision: Precision) -> Iterator[None]:
    """Run the training steps inside in ``precision``: auto (bf16 on CUDA, float32 elsewhere), float32 or bf16."""
    token = _PRECISION.set(precision)
    try:
        yield
    finally:
        _PRECISION.reset(token)


def autocast(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """A training step's forward pass: bf16 autocast on CUDA, or on any device where the run asked for bf16
    (``training_precision``); float32 otherwise. Only the forward pass: the callers clip, noise and sum the
    gradients in float32, and evaluation never enters here."""
    precision = _PRECISION.get()
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
