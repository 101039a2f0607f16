"""Device choice: CUDA when present (bf16 autocast there), else CPU; overridable by the user."""

from __future__ import annotations

import contextlib

import torch

from uedp.errors import UedpError


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


def autocast(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """bf16 autocast on CUDA; a no-op elsewhere."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
