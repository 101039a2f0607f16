"""Stopping a run that has diverged, instead of training on with a model that learns nothing.

What is watched is public to the adversary the guarantee is stated for, so watching costs no privacy:

* the **weights' norm** after each round (a function of the noised iterates, which the accounting
  already treats as released), against its value before the first round;
* the **update norm** a private round applied (its noised, averaged update: the same release);
* the **training loss**, only where a mechanism reports one (mechanisms without a guarantee; a private
  round's loss is a function of private data and is never handed out).

A run is stopped when one of them is not finite (at once), or when one stays far above its reference for
``patience`` rounds in a row. The update's and the loss's references are the median of their first
``WARMUP`` rounds (one easy first batch must not make ordinary ones look like a divergence). The factors
are wide on purpose: learning runs move their weights' norm by a few times at most, while a run whose
noise swamps its signal multiplies it by hundreds; a false stop would cost a user a run.

Which round a run stops at is read from what it released, so the epsilon it states stays the planned
run's (:meth:`privacy.mechanisms.loop.RoundLoop.run`): stopping saves the compute, not the budget.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

# A learning run's loss stays below twice its early value; a diverged one leaves it for good.
LOSS_GROWTH = 2.0
# The weights' norm (and a private round's update norm) may grow this many times before the run is
# called diverged: noise alone grows the weights like the square root of the rounds, a diverging run
# geometrically.
NORM_GROWTH = 50.0
PATIENCE = 3  # rounds in a row past a factor before stopping (a single noisy round is not a divergence)
WARMUP = 5  # rounds whose median is the update's and the loss's reference

_WORDS = {"weights": "weights' norm", "loss": "training loss", "update": "update's norm"}
_GROWTH = {"weights": NORM_GROWTH, "loss": LOSS_GROWTH, "update": NORM_GROWTH}


def weight_norm(params: Iterable[torch.Tensor]) -> float:
    """The L2 norm of the trainable weights (one host sync per round). Each tensor's norm is taken in its
    own precision and only the per-tensor norms in float64: a divergence check needs no more, and a float64
    copy of every weight took twice as long (gpt2:100m, 2 threads: 0.022 s a round against 0.048 s, beside
    a DP-SGD step of 2-7 s; ``python benchmarks/divergence_watch.py``). A norm past float32's range is inf:
    diverged either way."""
    norms = [p.detach().norm() for p in params if p.is_floating_point()]
    return float(torch.linalg.vector_norm(torch.stack(norms).double())) if norms else 0.0


@dataclass
class DivergenceWatch:
    """Watches one loop's rounds; :meth:`check` says why to stop, or None. Restorable, so a resumed run keeps
    the references of its first rounds rather than judging from where it resumed."""

    word: str = "round"
    patience: int = PATIENCE
    early: dict[str, list[float]] = field(default_factory=dict)  # each figure's first WARMUP values
    strikes: dict[str, int] = field(default_factory=dict)  # rounds in a row past its factor, per figure

    def start(self, weights: float) -> None:
        """The weights' norm before the first round is their reference (a resumed run keeps its own)."""
        self.early.setdefault("weights", [weights])

    def reference(self, name: str) -> float | None:
        values = self.early.get(name, [])
        if name != "weights" and len(values) < WARMUP:
            return None
        return statistics.median(values) if values else None

    def check(self, round_index: int, *, weights: float, loss: float | None = None,
              update: float | None = None) -> str | None:
        """Why the run must stop after ``round_index`` (None: it goes on)."""
        figures = {"weights": weights, **({"loss": loss} if loss is not None else {}),
                   **({"update": update} if update is not None else {})}
        for name, value in figures.items():
            if not math.isfinite(value):
                return f"the {_WORDS[name]} became {value} after {self.word} {round_index}"
        self.start(weights)
        for name, value in figures.items():
            if name != "weights" and len(self.early.setdefault(name, [])) < WARMUP:
                self.early[name].append(value)
        for name, value in figures.items():
            ref = self.reference(name)
            past = ref is not None and ref > 0 and value > _GROWTH[name] * ref
            self.strikes[name] = self.strikes.get(name, 0) + 1 if past else 0
            if past and self.strikes[name] >= self.patience:
                assert ref is not None
                return (f"the {_WORDS[name]} grew from {ref:.4g} to {value:.4g} ({value / ref:.0f}x) by {self.word} "
                        f"{round_index}, past {_GROWTH[name]:g}x for {self.patience} {self.word}s in a row")
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"early": {k: list(v) for k, v in self.early.items()}, "strikes": dict(self.strikes)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.early = {k: [float(x) for x in v] for k, v in state["early"].items()}
        self.strikes = {k: int(v) for k, v in state["strikes"].items()}
