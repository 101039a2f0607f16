"""Users' local updates vectorized with ``torch.func``: K SGD steps for a group of users at once, on
stacked copies of the parameters (``vmap`` over ``grad`` of a ``functional_call``).

It draws exactly the batches :class:`LocalTrainer` draws, in the same order, so the clipped sum is the
same up to float rounding (a test checks it). For Hugging Face causal LMs with right padding: padding
rows and columns carry label -100, so they add nothing to a user's loss, and the causal mask keeps
real tokens from seeing padding; the input embedding is looked up from the stacked weight and passed
as ``inputs_embeds`` (transformers inspects ``input_ids`` in Python, which ``vmap`` cannot trace).

Whether it is faster depends on the device: on a 2-core CPU a tiny GPT-2 is compute-bound and gains
little (``benchmarks/fedavg_round.py``); batching users pays where one user's step underfills the
device, as on a GPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from uedp.models.batching import IGNORE, Example, collate
from uedp.privacy.mechanisms.fedavg import ClippedSum, LocalTrainer
from uedp.privacy.primitives import clip_factor
from uedp.privacy.randomness import RandomSource


class VectorizedLocalTrainer(LocalTrainer):
    """:class:`LocalTrainer` with the users of a round trained together, ``group_size`` at a time."""

    def __init__(self, *args: object, group_size: int = 64, **kwargs: object):
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.group_size = group_size
        # PyTorch has no vmap batching rule for the CPU fused attention kernel (it would loop per user).
        # (torch types a module's other attributes as ``Tensor | Module``: the transformers methods are not seen.)
        if hasattr(self.worker, "set_attn_implementation"):
            self.worker.set_attn_implementation("eager")  # type: ignore[operator]
        self.names = [name for name, p in self.worker.named_parameters() if p.requires_grad]
        embedding = self.worker.get_input_embeddings().weight  # type: ignore[operator]
        self.embedding_name = next(n for n, p in self.worker.named_parameters() if p is embedding)

    def local_clipped_sum(self, theta: torch.Tensor, users: Sequence[Sequence[Example]], weights: Sequence[float],
                          streams: Sequence[RandomSource], clip: float) -> ClippedSum:
        total = torch.zeros_like(theta)
        active = [(sequences, weight, stream) for sequences, weight, stream in zip(users, weights, streams) if sequences]
        within = len(users) - len(active)  # users with nothing to train on: a zero delta, within any clip
        for start in range(0, len(active), self.group_size):
            group = active[start:start + self.group_size]
            deltas = self._group_deltas(theta, [sequences for sequences, _, _ in group], [s for _, _, s in group])
            for delta, (_, weight, _) in zip(deltas, group):
                factor = clip_factor(delta, clip)
                within += int(factor == 1.0)
                if factor:  # 0 for a diverged (non-finite) delta, which adds nothing: 0 * NaN would be NaN
                    total.add_(delta, alpha=weight * factor)
        return ClippedSum(total, within)

    def _group_deltas(self, theta: torch.Tensor, users: Sequence[Sequence[Example]],
                      streams: Sequence[RandomSource]) -> torch.Tensor:
        # The same batches, drawn in the same order from each user's own stream, as the sequential trainer.
        steps = [list(itertools.islice(self._cycle(sequences, stream), self.local_steps))
                 for sequences, stream in zip(users, streams)]
        params = self._unflatten(theta, len(users))
        step_grad = vmap(grad(self._loss))
        for k in range(self.local_steps):
            ids, labels = self._stack([collate(user_steps[k], self.pad_id) for user_steps in steps])
            grads = step_grad(params, ids.to(self.device), labels.to(self.device))
            params = {name: params[name] - self.local_lr * grads[name] for name in self.names}
        flat = torch.cat([params[name].reshape(len(users), -1) for name in self.names], dim=1)
        return flat - theta

    def _loss(self, params: dict[str, torch.Tensor], ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        embeds = F.embedding(ids, params[self.embedding_name])
        logits = functional_call(self.worker, params, kwargs={"inputs_embeds": embeds}).logits
        targets = labels[:, 1:]
        nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), targets.reshape(-1),
                              ignore_index=IGNORE, reduction="sum")
        return nll / (targets != IGNORE).sum().clamp(min=1)

    def _unflatten(self, theta: torch.Tensor, copies: int) -> dict[str, torch.Tensor]:
        shapes = {name: p.shape for name, p in self.worker.named_parameters() if p.requires_grad}
        out, offset = {}, 0
        for name in self.names:
            size = shapes[name].numel()
            out[name] = theta[offset:offset + size].view(shapes[name]).unsqueeze(0).expand(copies, *shapes[name]).clone()
            offset += size
        return out

    def _stack(self, batches: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = max(b["input_ids"].shape[0] for b in batches)
        width = max(b["input_ids"].shape[1] for b in batches)
        ids = torch.full((len(batches), rows, width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(batches), rows, width), IGNORE, dtype=torch.long)
        for i, b in enumerate(batches):
            r, w = b["input_ids"].shape
            ids[i, :r, :w] = b["input_ids"]
            labels[i, :r, :w] = b["labels"]
        return ids, labels
