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

Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021): the clip of a round may be set by
the mechanism (:class:`AdaptiveClip`); the trainers count the users whose delta was within it, from the
norm clipping computes anyway.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from uedp.models.batching import Example, example_batches, pack_consecutive
from uedp.models.parallel import Ranks
from uedp.models.training import LossFn, like_length_step
from uedp.privacy.mechanisms.base import TrainData
from uedp.privacy.primitives import assign_flat_, clip_factor, flatten, gaussian_noise
from uedp.privacy.randomness import RandomSource

# Any user's weight is at most 1, so max(w) * clip bounds one user's contribution even for a user who
# is added (the largest weight in this dataset would not be a bound).
WEIGHT_CEILING = 1.0
# Each sampled user adds b_u - 1/2 in {-1/2, +1/2} to the count adaptive clipping releases (b_u = 1 when its
# delta was within the clip): a user's term lies within 1/2 of the 0 an absent (or unsampled) user adds,
# so the count's sensitivity is 1/2 under add/remove and, in dp_accounting's REPLACE_ONE terms (records
# within the sensitivity of 0 on either side), under substitution too (AdaptiveClip).
COUNT_SENSITIVITY = 0.5


def user_weights(data: TrainData, weight_cap: float) -> torch.Tensor:
    """``w_u = min(n_u / cap, 1)`` in the order of ``data.by_user``: each from that user's own data only."""
    return torch.tensor([min(len(seqs) / weight_cap, 1.0) for seqs in data.by_user.values()], dtype=torch.float64)


class ClippedSum(NamedTuple):
    """``sum_u w_u clip(Delta_u, C)`` over a round's users, and how many of them had ``||Delta_u|| <= C``
    (not scaled down: a user with nothing to train on has a zero delta and counts; a non-finite delta,
    which adds nothing, does not)."""

    total: torch.Tensor
    within_clip: int


class AdaptiveClip:
    """The clip ``C_t`` of DP-FedAvg's rounds, moved toward a DP estimate of the ``target_quantile`` of the
    users' update norms (Andrew et al. 2021, geometric update; tensorflow_privacy's QuantileEstimatorQuery).

    After round t the server releases ``s = sum_u (b_u - 1/2) + N(0, count_noise^2)`` over the round's
    sampled users (:data:`COUNT_SENSITIVITY`), estimates the share within the clip as
    ``b = 1/2 + s / denominator`` (the fixed ``q_user * N`` the update is divided by: unbiased, as the
    expected number of sampled users is the denominator), clamped to [0, 1], and sets
    ``C_{t+1} = C_t exp(-lr (b - target_quantile))``. Every clip is a function of released noisy counts,
    so it is public; it is checkpointed (``state_dict``) so a resumed run goes on with the clip it had."""

    def __init__(self, start: float, target_quantile: float, lr: float, count_noise: float, denominator: float):
        if not (start > 0 and 0 < target_quantile < 1 and lr > 0 and count_noise > 0 and denominator > 0):
            raise ValueError("adaptive clipping needs a positive start, lr, count noise and denominator and a "
                             "target quantile in (0, 1)")
        self.start, self.value = start, start
        self.target_quantile, self.lr, self.count_noise, self.denominator = target_quantile, lr, count_noise, denominator

    def update(self, within_clip: int, sampled: int, source: np.random.Generator) -> float:
        """Release the round's noised count (noise from ``source``, the round's own secret stream) and move
        the clip; returns the released share of users within the clip."""
        noise = float(gaussian_noise((1,), self.count_noise, source, dtype=torch.float64))
        share = min(1.0, max(0.0, 0.5 + (within_clip - sampled / 2 + noise) / self.denominator))
        self.value *= math.exp(-self.lr * (share - self.target_quantile))
        return share

    def state_dict(self) -> dict[str, Any]:
        return {"clip": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["clip"])


class LocalTrainer:
    """Runs users' local updates on one reused worker copy of the model and sums their clipped deltas."""

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn, device: torch.device, pad_id: int, clip: float,
                 local_steps: int, local_batch_size: int, local_lr: float, chunk_tokens: int = 0):
        self.worker = copy.deepcopy(model).to(device)
        self.worker.train()
        self.params = [p for p in self.worker.parameters() if p.requires_grad]
        self.loss_fn, self.device, self.pad_id, self.clip = loss_fn, device, pad_id, clip
        self.local_steps, self.local_batch_size, self.local_lr = local_steps, local_batch_size, local_lr
        self.chunk_tokens = chunk_tokens  # > 0: a user's sentences are packed into chunks of at most this many tokens
        self.ranks = Ranks.current()

    def clipped_sum(self, theta: torch.Tensor, users: Sequence[Sequence[Example]], weights: Sequence[float],
                    streams: Sequence[RandomSource], clip: float | None = None) -> torch.Tensor:
        """``sum_u w_u clip(Delta_u, clip)``: the quantity whose sensitivity the mechanisms bound
        (``clip`` defaults to the trainer's own; see :meth:`clipped_sum_with_count`)."""
        return self.clipped_sum_with_count(theta, users, weights, streams, clip).total

    def clipped_sum_with_count(self, theta: torch.Tensor, users: Sequence[Sequence[Example]],
                               weights: Sequence[float], streams: Sequence[RandomSource],
                               clip: float | None = None) -> ClippedSum:
        """The clipped sum at ``clip`` (the round's; default the trainer's) and how many users were within it.

        ``streams[i]`` orders user i's local batches (its own stream). A user with no usable sequence
        this round contributes nothing (a zero delta). Under torchrun each process sums its share of
        the users and the shares and counts are added by one collective (the count travels as one more
        float32 value of the sum: exact below 2^24 users a round).
        """
        if not len(users) == len(weights) == len(streams):
            raise ValueError("one weight and one random stream per user")
        mine = self.ranks.mine(list(zip(users, weights, streams)))
        local = self.local_clipped_sum(theta, [u for u, _, _ in mine], [w for _, w, _ in mine],
                                       [g for _, _, g in mine], self.clip if clip is None else clip)
        if self.ranks.world == 1:
            return local
        count = local.total.new_tensor([local.within_clip])
        total, count = self.ranks.sum_([local.total, count])
        return ClippedSum(total, int(count.item()))

    def local_clipped_sum(self, theta: torch.Tensor, users: Sequence[Sequence[Example]], weights: Sequence[float],
                          streams: Sequence[RandomSource], clip: float) -> ClippedSum:
        """The clipped sum over the users this process trains, and how many were within ``clip``."""
        total, within = torch.zeros_like(theta), 0
        for sequences, weight, stream in zip(users, weights, streams):
            if not sequences:
                within += 1  # a zero delta
                continue
            delta = self.local_delta(theta, sequences, stream)
            factor = clip_factor(delta, clip)  # the norm is computed once, for clipping and the count
            within += int(factor == 1.0)
            if factor:  # 0 for a diverged (non-finite) delta, which adds nothing: 0 * NaN would be NaN
                total.add_(delta, alpha=weight * factor)  # clipped as it is added
        return ClippedSum(total, within)

    def local_delta(self, theta: torch.Tensor, sequences: Sequence[Example], stream: RandomSource) -> torch.Tensor:
        """K local SGD steps from ``theta``, batches in the order ``stream`` draws; returns ``theta_u - theta``."""
        assign_flat_(self.params, theta)
        optimizer = torch.optim.SGD(self.params, lr=self.local_lr)
        for examples in itertools.islice(self._cycle(sequences, stream), self.local_steps):
            like_length_step(self.worker, optimizer, examples, self.pad_id, self.loss_fn, self.device)
        return flatten(self.params).sub_(theta)

    def _cycle(self, sequences: Sequence[Example], stream: RandomSource) -> Iterator[list[Example]]:
        """The user's local batches, endlessly, in the order its own stream draws: of its sentences, or of
        chunks packed from them (a function of this user's sentences only, so the delta's sensitivity is
        unchanged: one user's clipped delta either way)."""
        if self.chunk_tokens:
            sequences = pack_consecutive(sequences, self.chunk_tokens)
        while True:
            yield from example_batches(sequences, self.local_batch_size, stream)
