"""Per-example gradients in factored form, so their norms and clipped sums need not be materialised.

A layer applied to the tokens of example ``i`` has a weight gradient that is a sum of outer products
over those tokens: a linear layer ``y = x W^T`` gives ``G_i = sum_t g_it^T x_it`` (``g`` the gradient of
the loss at the layer's output). :class:`Outer` keeps the two sides, ``left`` (B, T, m) and ``right``
(B, T, n), instead of the (B, m, n) per-example gradients. Then (ghost clipping, Li et al. 2022; the
mixed strategy of Bu et al. 2023):

* ``<G_i, H_i> = sum_{t,s} (left_it . left'_is) (right_it . right'_is)``: two (T x T') Gram matrices
  per example, cheap when T^2 (m + n) < T m n, which is the case for wide layers;
* ``sum_i c_i G_i = (c * left)^T right``: one matrix product, the cost of an ordinary weight gradient.

An embedding is the same with a one-hot ``left`` (the token ids): its Gram matrices are comparisons of
ids, or a gather from the other side. A parameter used by several layers (GPT-2's tied input and output
embedding) has one factor per use, and its per-example norm includes the cross terms between them:
summing the squared norms of the uses, or keeping only the last one, would undercount.

:class:`Dense` holds per-example gradients that are small enough to keep (biases, layer norms) or
come from a layer without a factored rule (materialised by ``torch.func``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Dense", "Factor", "Outer"]


@dataclass(frozen=True)
class Outer:
    """``G_i = sum_t left[i, t] (x) right[i, t]``, an (m, n) gradient per example.

    ``left`` is (B, T, m), or (B, T) integer ids standing for one-hot rows of width m (``one_hot``);
    ``right`` is (B, T, n). Rows of ``right`` that must not count (an embedding's padding index) are
    zero.
    """

    left: torch.Tensor
    right: torch.Tensor
    rows: int  # m
    one_hot: bool = False

    @property
    def batch(self) -> int:
        return int(self.right.shape[0])

    @property
    def tokens(self) -> int:
        return int(self.right.shape[1])

    @property
    def columns(self) -> int:
        return int(self.right.shape[2])

    def concat(self, other: Outer) -> Outer:
        """The factor of the summed gradient of two uses of one layer (the tokens of both, side by side)."""
        return Outer(torch.cat([self.left, other.left], dim=1), torch.cat([self.right, other.right], dim=1),
                     self.rows, self.one_hot)

    def left_gram(self, other: Outer) -> torch.Tensor:
        """(B, T, T'): ``left_it . other.left_is``."""
        if self.one_hot and other.one_hot:
            return (self.left[:, :, None] == other.left[:, None, :]).to(self.right.dtype)
        if self.one_hot:  # e_{id_t} . l'_s = l'_s[id_t]
            index = self.left[:, None, :].expand(-1, other.tokens, -1)
            return other.left.gather(2, index).transpose(1, 2)
        if other.one_hot:
            return self.left.gather(2, other.left[:, None, :].expand(-1, self.tokens, -1))
        return torch.bmm(self.left, other.left.transpose(1, 2))

    def inner(self, other: Outer) -> torch.Tensor:
        """``<G_i, H_i>`` per example, from Gram matrices (nothing of size m x n is formed), in float64:
        the sum has terms of both signs (and a shared parameter's cross terms are negative at times), so
        float32 cancellation could understate a norm, and clipping would then clip too little."""
        a = self.to_double()
        b = a if other is self else other.to_double()  # a norm's own pair: one float64 copy, not two
        right = torch.bmm(a.right, b.right.transpose(1, 2))
        return (a.left_gram(b) * right).sum(dim=(1, 2))

    def to_double(self) -> Outer:
        left = self.left if self.one_hot else self.left.double()
        return Outer(left, self.right.double(), self.rows, self.one_hot)

    def materialise(self) -> torch.Tensor:
        """The (B, m, n) per-example gradients."""
        if not self.one_hot:
            return torch.einsum("btm,btn->bmn", self.left, self.right)
        out = self.right.new_zeros(self.batch * self.rows, self.columns)
        offsets = torch.arange(self.batch, device=self.left.device)[:, None] * self.rows
        out.index_add_(0, (self.left + offsets).reshape(-1), self.right.reshape(-1, self.columns))
        return out.view(self.batch, self.rows, self.columns)

    def weighted_sum(self, weights: torch.Tensor) -> torch.Tensor:
        """``sum_i weights_i G_i`` as one (m, n) product."""
        right = (self.right * weights[:, None, None]).reshape(-1, self.columns)
        if self.one_hot:
            return right.new_zeros(self.rows, self.columns).index_add_(0, self.left.reshape(-1), right)
        return self.left.reshape(-1, self.rows).transpose(0, 1) @ right

    def without(self, dropped: torch.Tensor) -> Outer:
        """The same factor with the examples ``dropped`` (a (B,) bool mask) zeroed, non-finite values included."""
        right = torch.where(dropped[:, None, None], 0.0, self.right)
        left = self.left if self.one_hot else torch.where(dropped[:, None, None], 0.0, self.left)
        return Outer(left, right, self.rows, self.one_hot)

    def ghost_cost(self, other: Outer) -> int:
        """Multiply-adds of :meth:`inner` with ``other``."""
        left = 1 if (self.one_hot or other.one_hot) else self.rows
        return self.batch * self.tokens * other.tokens * (left + self.columns)

    def materialise_cost(self) -> int:
        """Multiply-adds of :meth:`materialise`."""
        return self.batch * self.tokens * self.columns * (1 if self.one_hot else self.rows)


@dataclass(frozen=True)
class Dense:
    """Per-example gradients as they are: (B, *parameter shape)."""

    per_sample: torch.Tensor

    def materialise(self) -> torch.Tensor:
        return self.per_sample

    def without(self, dropped: torch.Tensor) -> Dense:
        shape = (-1,) + (1,) * (self.per_sample.dim() - 1)
        return Dense(torch.where(dropped.view(shape), 0.0, self.per_sample))


Factor = Outer | Dense
