"""One optimizer step, shared by every training loop so autocast and gradient hygiene live in one place."""

from __future__ import annotations

from typing import Callable

import torch

from models.device import autocast

LossFn = Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor]


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                   loss_fn: LossFn, device: torch.device) -> float:
    """Move ``batch`` to ``device``, take one step on ``loss_fn``, return the loss value."""
    batch = {k: v.to(device) for k, v in batch.items()}
    with autocast(device):
        loss = loss_fn(model, batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()
