"""What user-level mechanisms share (DP-FedAvg, McMahan et al. 2018): K local SGD steps per sampled
user from the global weights, the user's model delta clipped in L2 over all trainable parameters,
weighted and summed.

Under ``torchrun`` each process trains its share of the round's users and one all-reduce adds the
clipped sums (``models.parallel``); noise is added once, to the total, by the mechanism.

Randomness: every user's local batch order comes from its own stream, one per (round, user) drawn
by the mechanism from the run's :class:`privacy.randomness.Randomness`: adding a user must not
reorder another user's batches, or the sum would move by more than the accounted sensitivity.

Speed: one preallocated worker model is reused for every user (its parameters are overwritten with the
global ones), instead of a deep copy per user as the UeDP reference code does.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator, Sequence

import torch

from uedp.models.batching import Example, batches
from uedp.models.parallel import Ranks
from uedp.models.training import LossFn, optimizer_step
from uedp.privacy.mechanisms.base import TrainData
from uedp.privacy.primitives import assign_flat_, clip_factor, flatten
from uedp.privacy.randomness import RandomSource

# Any user's weight is at most 1, so max(w) * clip bounds one user's contribution even for a user who
# is added (the largest weight in this dataset would not be a bound).
WEIGHT_CEILING = 1.0


def user_weights(data: TrainData, weight_cap: float) -> torch.Tensor:
    """``w_u = min(n_u / cap, 1)`` in the order of ``data.by_user``: each from that user's own data only."""
    return torch.tensor([min(len(seqs) / weight_cap, 1.0) for seqs in data.by_user.values()], dtype=torch.float64)


class LocalTrainer:
    """Runs users' local updates on one reused worker copy of the model and sums their clipped deltas."""

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn, device: torch.device, pad_id: int, clip: float,
                 local_steps: int, local_batch_size: int, local_lr: float):
        self.worker = copy.deepcopy(model).to(device)
        self.worker.train()
        self.params = [p for p in self.worker.parameters() if p.requires_grad]
        self.loss_fn, self.device, self.pad_id, self.clip = loss_fn, device, pad_id, clip
        self.local_steps, self.local_batch_size, self.local_lr = local_steps, local_batch_size, local_lr
        self.ranks = Ranks.current()

    def clipped_sum(self, theta: torch.Tensor, users: Sequence[Sequence[Example]], weights: Sequence[float],
                    streams: Sequence[RandomSource]) -> torch.Tensor:
        """``sum_u w_u clip(Delta_u, clip)``: the quantity whose sensitivity the mechanisms bound.

        ``streams[i]`` orders user i's local batches (its own stream). A user with no usable sequence
        this round contributes nothing (a zero delta). Under torchrun each process sums its share of
        the users and the shares are added.
        """
        if not len(users) == len(weights) == len(streams):
            raise ValueError("one weight and one random stream per user")
        mine = self.ranks.mine(list(zip(users, weights, streams)))
        total = self.local_clipped_sum(theta, [u for u, _, _ in mine], [w for _, w, _ in mine], [g for _, _, g in mine])
        return self.ranks.sum_([total])[0]

    def local_clipped_sum(self, theta: torch.Tensor, users: Sequence[Sequence[Example]], weights: Sequence[float],
                          streams: Sequence[RandomSource]) -> torch.Tensor:
        """The clipped sum over the users this process trains."""
        total = torch.zeros_like(theta)
        for sequences, weight, stream in zip(users, weights, streams):
            if sequences:
                delta = self.local_delta(theta, sequences, stream)
                factor = clip_factor(delta, self.clip)
                if factor:  # 0 for a diverged (non-finite) delta, which adds nothing: 0 * NaN would be NaN
                    total.add_(delta, alpha=weight * factor)  # clipped as it is added
        return total

    def local_delta(self, theta: torch.Tensor, sequences: Sequence[Example], stream: RandomSource) -> torch.Tensor:
        """K local SGD steps from ``theta``, batches in the order ``stream`` draws; returns ``theta_u - theta``."""
        assign_flat_(self.params, theta)
        optimizer = torch.optim.SGD(self.params, lr=self.local_lr)
        for batch in itertools.islice(self._cycle(sequences, stream), self.local_steps):
            optimizer_step(self.worker, optimizer, batch, self.loss_fn, self.device)
        return flatten(self.params).sub_(theta)

    def _cycle(self, sequences: Sequence[Example], stream: RandomSource) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            yield from batches(sequences, self.local_batch_size, self.pad_id, stream)
