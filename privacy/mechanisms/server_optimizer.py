"""What the server does with a round's noised, averaged update: the server optimizer of DP-FedAvg.

Every user-level mechanism (userdp, uedp-bounded, uedp) releases one noised average of clipped user
deltas per round, ``Delta_t = (sum of clipped deltas + noise) / denominator``. Everything the server
does with the sequence ``Delta_1, Delta_2, ...`` afterwards is post-processing of released values:
it costs no epsilon and changes no sensitivity, so any optimizer here keeps the run's guarantee.

* ``sgd`` (DP-FedAvg, McMahan et al. 2018): ``theta += lr * Delta``.
* ``momentum`` (DP-FedAvgM; Hsu et al. 2019, the Gboard deployments): ``m = beta1 * m + Delta``,
  ``theta += lr * m``. At a steady state the step is ``lr / (1 - beta1)`` times the average update, so
  ``lr = 1 - beta1`` moves as far as ``sgd`` at 1 while averaging the noise of about ``1 / (1 - beta1)``
  rounds.
* ``adam`` (DP-FedAdam; Reddi et al. 2021, "Adaptive Federated Optimization", Algorithm 2):
  ``m = beta1 m + (1 - beta1) Delta``, ``v = beta2 v + (1 - beta2) Delta^2``,
  ``theta += lr * m / (sqrt(v) + tau)``. Each coordinate's step is about ``lr`` whatever the scale of
  the update, so the learning rate means what it means for Adam in step-based training (1e-3 from a
  pretrained start, as dpsgd uses), and coordinates the noise dominates move by their signal-to-noise.

The state (``m``, ``v``) is a function of released updates only; it is checkpointed with the weights so
a resumed run goes on exactly as an uninterrupted one.
"""

from __future__ import annotations

from typing import Any

import torch

from uedp.privacy.mechanisms.params import DEFAULT_SERVER_LR, ServerOptimizerKind


class ServerOptimizer:
    """Applies each round's released update to the flat weights, keeping the optimizer's moments."""

    def __init__(self, kind: ServerOptimizerKind, lr: float, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3):
        if kind not in DEFAULT_SERVER_LR:
            raise ValueError(f"unknown server optimizer {kind!r} (sgd, momentum or adam)")
        self.kind, self.lr, self.beta1, self.beta2, self.tau = kind, lr, beta1, beta2, tau
        self.first: torch.Tensor | None = None  # m: momentum and adam
        self.second: torch.Tensor | None = None  # v: adam
        self.rounds = 0

    def step_(self, update: torch.Tensor) -> torch.Tensor:
        """The change to apply to the weights for this round's averaged noised ``update`` (overwritten:
        the caller's buffer is reused, so no model-sized temporary is kept beyond the moments)."""
        self.rounds += 1
        if self.kind == "sgd":
            return update.mul_(self.lr)
        if self.first is None:
            self.first = torch.zeros_like(update)
        elif self.first.device != update.device:  # restored from a checkpoint, which keeps them on the CPU
            self.first = self.first.to(update.device)
            self.second = None if self.second is None else self.second.to(update.device)
        if self.kind == "momentum":
            self.first.mul_(self.beta1).add_(update)
            return update.copy_(self.first).mul_(self.lr)
        if self.second is None:
            self.second = torch.zeros_like(update)
        self.first.mul_(self.beta1).add_(update, alpha=1 - self.beta1)
        self.second.mul_(self.beta2).addcmul_(update, update, value=1 - self.beta2)
        return update.copy_(self.second).sqrt_().add_(self.tau).reciprocal_().mul_(self.first).mul_(self.lr)

    def describe(self) -> str:
        """One line for the statement: the rule applied, and that it is post-processing."""
        rule = {"sgd": f"theta += {self.lr:g} * update",
                "momentum": f"momentum {self.beta1:g}, learning rate {self.lr:g}",
                "adam": f"Adam (beta1 {self.beta1:g}, beta2 {self.beta2:g}, tau {self.tau:g}), learning rate "
                        f"{self.lr:g}"}[self.kind]
        return (f"server optimizer {self.kind} ({rule}): applied to the released noised averages only, so it is "
                "post-processing and costs no epsilon")

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rounds": self.rounds,
                "first": None if self.first is None else self.first.detach().cpu().clone(),
                "second": None if self.second is None else self.second.detach().cpu().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["kind"] != self.kind:
            raise ValueError(f"the checkpoint's server optimizer is {state['kind']}, this run's {self.kind}")
        self.rounds = int(state["rounds"])
        self.first = state["first"]
        self.second = state["second"]
