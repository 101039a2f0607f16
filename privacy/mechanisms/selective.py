"""``selective`` for transformers: the two-phase form of Selective DP (``selective-dp.txt`` section 6,
after Shi et al. 2022). Phase 1 fine-tunes noiselessly on the redacted corpus (detected sensitive
spans replaced by ``[CATEGORY]``); phase 2 fine-tunes that model with DP-SGD on the original corpus.

The privacy unit is one sensitive token (Selective DP's F-neighbours): phase 1 sees no sensitive span,
so the epsilon is that of the DP-SGD phase. This rests on detection: a sensitive span the detector
missed reaches phase 1 unprotected by noise, as it would under any policy function.

F-neighbours differ in the *value* of a private token; the sequence holding it is in both datasets.
That is replace-one adjacency, so phase 2 is accounted with dp_accounting's PLD under REPLACE_ONE
(a clipped gradient can move by twice the clip bound), not the add/remove figure plain DP-SGD reports
for whole sequences: the same noise gives a larger, and honest, epsilon. The Selective-DP paper's
analysis takes the sensitivity as C, which holds only for add/remove.

For the LSTM, ``selective`` is the recurrent Selective-DPSGD of
:mod:`privacy.mechanisms.selective_recurrent` instead.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from uedp.errors import UedpError
from uedp.models.metrics import causal_lm_loss
from uedp.privacy.mechanisms.base import (
    NO_CHECKPOINT,
    Checkpointer,
    HostUnits,
    LossFn,
    OnRound,
    RoundReport,
    TrainData,
    Trained,
)
from uedp.privacy.mechanisms.dpsgd import DpSgd
from uedp.privacy.mechanisms.loop import DIVERGED
from uedp.privacy.mechanisms.noiseless import Noiseless
from uedp.privacy.mechanisms.params import NoiselessParams, SelectiveParams
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness
from uedp.privacy.signal import NoiseToSignal
from uedp.privacy.statement import PrivacyStatement

# What the selective epsilon does not cover (PRIVACY.md): shown next to it everywhere.
MISSED_TOKENS_CAVEAT = ("only tokens the detector found are protected as tokens: a missed name reaches the noiseless "
                        "phase 1 unprotected, and is protected in phase 2 only as part of its sequence")


class _ReplaceOneDpSgd(DpSgd):
    """Phase 2: DP-SGD whose neighbours differ in one token's value (replace-one), so the sequence count is public."""

    name = "selective"
    adjacency = "replace"


class SelectiveTwoPhase:
    name = "selective"
    unit = SelectiveParams.unit_words

    def __init__(self, params: SelectiveParams, n_examples: int, public_loss: LossFn = causal_lm_loss,
                 randomness: Randomness | None = None, seed: int = 0):
        self.params = params
        self.public = (Noiseless(NoiselessParams(steps=params.public_steps, batch_size=params.batch_size,
                                                 lr=params.lr), seed) if params.public_steps else None)
        self.public_loss = public_loss  # phase 1's objective: the ordinary LM loss
        # F-neighbours change a token's value, never the number of sequences: the count is public.
        self.dpsgd = _ReplaceOneDpSgd(params, Population.public_by_adjacency(n_examples), randomness)
        self.noise_multiplier = self.dpsgd.noise_multiplier

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT) -> Trained:
        """``data.redacted`` feeds phase 1; ``data`` phase 2, whose ``loss_fn`` must be per-example (DP-SGD)."""
        if data.redacted is None:
            raise ValueError("selective needs the redacted corpus (TrainData.redacted)")
        offset = self.params.public_steps
        if self.public is not None and checkpoint.saved_scope() != "selective-private":  # a checkpoint of phase 2: phase 1 is done
            public = TrainData(data.redacted, data.pad_id)
            first = self.public.train(
                model, public, self.public_loss, device,
                lambda r: on_round(RoundReport(r.round, r.loss, 0.0, self.params.delta)),
                checkpoint, scope="selective-public").statement.notes
            if DIVERGED in first:  # phase 2 would spend its budget on a diverged start
                raise UedpError(f"selective: the noiseless phase on the redacted text diverged, so the private phase "
                                f"did not run and nothing private was trained ({first}); lower --lr")
        second = self.dpsgd.train(
            model, data, loss_fn, device,
            lambda r: on_round(RoundReport(offset + r.round, r.loss, r.epsilon, r.delta)),
            checkpoint, scope="selective-private").statement
        return Trained(PrivacyStatement(
            mechanism=self.name, unit=self.unit, epsilon=second.epsilon, delta=second.delta,
            accountant=second.accountant, noise_multiplier=second.noise_multiplier,
            sampling_probability=second.sampling_probability, rounds=offset + second.rounds,
            notes=second.notes, extra={**second.extra, "public_steps": float(offset)},
            randomness=second.randomness, public=second.public, caveats=(*second.caveats, MISSED_TOKENS_CAVEAT),
        ), sampling=self)

    def planned_epsilon(self) -> float:
        """Phase 2's: the only phase that accounts anything."""
        return self.dpsgd.planned_epsilon()

    def noise_to_signal(self, units: float) -> NoiseToSignal:
        """Phase 2's (DP-SGD on the sequences, whose count is public by the adjacency)."""
        return replace(self.dpsgd.noise_to_signal(units), mechanism=self.name)

    def rounds_with(self, units: HostUnits, rounds: range) -> int:
        """Phase 2's steps among ``rounds`` (numbered after phase 1's) that sample ``units.sequences``."""
        offset = self.params.public_steps
        return self.dpsgd.rounds_with(units, range(max(1, rounds.start - offset), max(1, rounds.stop - offset)))
