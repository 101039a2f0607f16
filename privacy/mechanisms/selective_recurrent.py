"""``selective`` for recurrent models: Selective-DPSGD (``selective-dp.txt`` Alg. 1), as PRIVACY.md
specifies, on :class:`models.lstm.LstmLanguageModel`.

Per step, sequences are Poisson-sampled with ``q = B / N``. One unrolled forward pass feeds every token;
the LSTM state after a private token (a token inside a detected span of the chosen categories) is
clipped to ``hidden_clip`` (h and c jointly, L2), given Gaussian noise ``z * hidden_clip`` and detached
before the next token sees it. The next-token losses then split in two:

* public losses (neither the input nor the target token is private) give the regular gradient, with no
  noise: they depend on public tokens and on released (noised) states only;
* private losses (input or target private) give, per sequence, a gradient clipped to ``clip``, summed,
  noised with ``z * clip`` and divided by ``B`` (DP-SGD, Opacus per-example gradients).

The two gradients are applied together by Adam (post-processing). Both forward passes of a step (one
without, one with Opacus' hooks) use the same pre-drawn state noise, so they see the same released states.

Accounting. Selective DP's neighbours differ in one private token's *value*: replace-one adjacency. A
changed token moves its sequence's clipped private gradient and the one state released right after it
(later states see it only through that noised release); both happen only when its sequence is sampled.
Each step is therefore ``PoissonSampled(q, Gaussian(z / sqrt 2))`` (the two unit-sensitivity Gaussian
releases, each at multiplier z, compose to one at ``z / sqrt 2``) under REPLACE_ONE, by dp_accounting's
PLD. A sequence with no private token contributes only regular updates.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import dp_accounting
import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # Opacus and the LSTM (transformers) load when a run trains, not when the registry is read
    from opacus import GradSampleModule

    from uedp.models.lstm import LstmLanguageModel

from uedp.models.batching import IGNORE, collate
from uedp.models.device import autocast
from uedp.privacy.accounting.events import Adjacency
from uedp.privacy.mechanisms.base import LossFn, TrainData
from uedp.privacy.mechanisms.dpsgd import DpSgd
from uedp.privacy.mechanisms.params import SelectiveParams
from uedp.privacy.per_sample import PerSampleClipping
from uedp.privacy.per_sample.opacus_path import OpacusClipping, sum_clipped_grad_samples
from uedp.privacy.population import Population
from uedp.privacy.primitives import gaussian_noise, gaussian_noise_like
from uedp.privacy.randomness import Randomness, RandomSource

# release(h, c, rows, t) -> the released (h, c) of those rows: see LstmLanguageModel.forward_releasing_states.
Release = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]

TOKEN_UNIT = ("one token's value inside a detected sensitive span (Selective-DPSGD, replace-one; spans the detector "
              "missed are not covered)")
BYTE_UNIT = ("one byte's value inside a detected sensitive span (Selective-DPSGD with the byte-level tokenizer, "
             "replace-one: a name of 13 letters is 13 units; spans the detector missed are not covered)")
BYTE_UNIT_CAVEAT = ("with the byte-level tokenizer the unit is one byte of a detected span, not the span: a name of "
                    "L bytes is protected as a whole only at up to L times this epsilon (group privacy)")
MISSED_TOKENS_CAVEAT = ("only tokens the detector found are protected as tokens: the hidden state after a missed "
                        "name is released without noise, and its loss trains the regular (noiseless) gradient")


def step_event(sampling_probability: float, noise_multiplier: float) -> dp_accounting.DpEvent:
    """One step: the private gradient and one released state per changed token, same sampling coin."""
    return dp_accounting.PoissonSampledDpEvent(sampling_probability,
                                               dp_accounting.GaussianDpEvent(noise_multiplier / math.sqrt(2)))


class SelectiveRecurrent(DpSgd):
    """DP-SGD's loop (sampling, accounting, checkpoints) with Selective-DPSGD's step.

    The unit is one *token* of a detected span: its value changes one state release and one private
    gradient. With the byte-level tokenizer a token is a byte, so a 13-letter name is 13 units and the
    epsilon protects one of its bytes; the statement's unit and a caveat say so wherever it is shown."""

    name = "selective"
    loss_reduction: Literal["mean", "sum"] = "sum"  # the private loss is a sum of per-sequence losses
    adjacency: Adjacency = "replace"  # Selective DP's F-neighbours; the only adjacency this mechanism accounts

    def __init__(self, params: SelectiveParams, n_examples: int, randomness: Randomness | None = None,
                 byte_tokens: bool = True):
        if params.max_physical_batch is not None:  # its Opacus hooks switch on and off within one batch
            raise ValueError("max_physical_batch is not supported by the recurrent Selective-DPSGD (LSTM)")
        self.byte_tokens = byte_tokens
        self.unit = BYTE_UNIT if byte_tokens else TOKEN_UNIT
        self.params: SelectiveParams = params
        # F-neighbours change a token's value, never the number of sequences: the count is public.
        super().__init__(params, Population.public_by_adjacency(n_examples), randomness)

    def round_event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        return step_event(self.sample_rate, noise_multiplier)

    def examples(self, model: torch.nn.Module, data: TrainData) -> list[Any]:
        """(sequence, private-token mask) pairs; ``loss_fn`` is unused: the loss is split by token privacy."""
        from uedp.models.lstm import LstmLanguageModel

        if not isinstance(model, LstmLanguageModel):
            raise ValueError("recurrent selective trains the LSTM language model (--model lstm)")
        if data.private_masks is None:
            raise ValueError("recurrent selective needs each sequence's private-token mask (TrainData.private_masks)")
        masks = [m for user_masks in data.private_masks.values() for m in user_masks]
        return list(zip(data.sequences, masks))

    def statement_caveats(self) -> tuple[str, ...]:
        return (MISSED_TOKENS_CAVEAT, *((BYTE_UNIT_CAVEAT,) if self.byte_tokens else ()))

    def statement_extra(self) -> dict[str, float]:
        return {"hidden_noise_std": self.noise_multiplier * self.params.hidden_clip, "releases_per_step": 2.0}

    def per_sample_clipping(self, model: torch.nn.Module) -> PerSampleClipping:
        """Opacus' path always: the step switches its hooks off for the regular update and on for the private one."""
        return OpacusClipping(model, self.loss_reduction)

    def step_gradient(self, clipping: PerSampleClipping, model: torch.nn.Module, params: list[torch.Tensor],
                      batch: list[Any], loss_fn: LossFn, device: torch.device, pad_id: int,
                      noise_gen: RandomSource) -> list[torch.Tensor]:
        from uedp.models.lstm import LstmLanguageModel

        assert isinstance(model, LstmLanguageModel) and isinstance(clipping, OpacusClipping)
        return self.step_gradients(clipping.module, model, params, [s for s, _ in batch], [m for _, m in batch], pad_id,
                                   device, noise_gen)

    def step_gradients(self, private: GradSampleModule, model: LstmLanguageModel, params: list[torch.Tensor],
                       batch: list[torch.Tensor], masks: list[torch.Tensor], pad_id: int, device: torch.device,
                       noise_gen: RandomSource) -> list[torch.Tensor]:
        """Regular gradient of the public losses plus the noised, clipped private gradient, per parameter."""
        p, z = self.params, self.noise_multiplier
        private_noise = gaussian_noise_like(params, z * p.clip, noise_gen)
        if not batch:
            return [noise / p.batch_size for noise in private_noise]
        inputs = {k: v.to(device) for k, v in collate(batch, pad_id).items()}
        ids = inputs["input_ids"]
        is_private = torch.zeros_like(ids, dtype=torch.bool)
        for row, mask in enumerate(masks):
            is_private[row, : len(mask)] = mask.to(device)
        state_noise = gaussian_noise((*ids.shape, 2 * model.config.hidden_size), z * p.hidden_clip, noise_gen,
                                     torch.float32, device)  # on a GPU, drawn there

        def release(h: torch.Tensor, c: torch.Tensor, rows: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
            joint = torch.cat([h, c], dim=1).detach()  # nothing downstream differentiates into a private token
            norms = joint.norm(dim=1, keepdim=True)
            clipped = joint * torch.clamp(p.hidden_clip / (norms + 1e-12), max=1.0)
            clipped = torch.where(torch.isfinite(norms), clipped, torch.zeros_like(clipped))
            noised = clipped + state_noise[rows, t]
            return noised[:, : h.shape[1]], noised[:, h.shape[1]:]

        targets = inputs["labels"][:, 1:]
        valid = targets != IGNORE
        private_loss = (is_private[:, :-1] | is_private[:, 1:]) & valid

        # Regular update: public losses, plain gradient (Opacus' hooks off).
        private.disable_hooks()
        with autocast(device):
            nll = self._token_nll(model, ids, is_private, release, targets)
        public = valid & ~private_loss
        with warnings.catch_warnings():  # Opacus' (disabled) hooks still make PyTorch note they see outputs only
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            regular = torch.autograd.grad((nll * public).sum() / public.sum().clamp(min=1), params, allow_unused=True)
        private.enable_hooks()
        # Private update: per-sequence private losses, Opacus per-example gradients, clipped and noised.
        with autocast(device):
            nll = self._token_nll(private, ids, is_private, release, targets)
        per_sequence = (nll * private_loss).sum(1) / private_loss.sum(1).clamp(min=1)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            per_sequence.sum().backward()  # type: ignore[no-untyped-call]
        summed = sum_clipped_grad_samples(params, len(batch), p.clip)
        return [(reg if reg is not None else torch.zeros_like(total)) + (total + noise) / p.batch_size
                for reg, total, noise in zip(regular, summed, private_noise)]

    @staticmethod
    def _token_nll(model: LstmLanguageModel | GradSampleModule, ids: torch.Tensor, is_private: torch.Tensor,
                   release: Release, targets: torch.Tensor) -> torch.Tensor:
        from opacus import GradSampleModule

        base = model._module if isinstance(model, GradSampleModule) else model
        logits = base.forward_releasing_states(ids, is_private, release)
        return F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), targets, ignore_index=IGNORE, reduction="none")
