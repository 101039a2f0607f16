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

from dataclasses import dataclass, replace

import torch

from uedp.models.metrics import causal_lm_loss
from uedp.privacy.mechanisms.base import NO_CHECKPOINT, Checkpointer, LossFn, OnRound, PrivacyStatement, RoundReport, TrainData
from uedp.privacy.mechanisms.dpsgd import DpSgd, DpSgdParams
from uedp.privacy.mechanisms.noiseless import Noiseless, NoiselessParams
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness

# What the selective epsilon does not cover (PRIVACY.md): shown next to it everywhere.
MISSED_TOKENS_CAVEAT = ("only tokens the detector found are protected as tokens: a missed name reaches the noiseless "
                        "phase 1 unprotected, and is protected in phase 2 only as part of its sequence")


@dataclass
class SelectiveParams:
    public: NoiselessParams  # phase 1, on redacted text
    private: DpSgdParams  # phase 2, on the original text


class SelectiveTwoPhase:
    name = "selective"
    unit = "one sensitive token's value (Selective DP, replace-one; spans the detector missed are not covered)"

    def __init__(self, params: SelectiveParams, n_examples: int, public_loss: LossFn = causal_lm_loss,
                 randomness: Randomness | None = None):
        if params.private.accountant != "pld":
            raise ValueError("selective is accounted under replace-one adjacency, which only the pld accountant supports")
        self.params = SelectiveParams(params.public, replace(params.private, adjacency="replace"))
        self.public_loss = public_loss  # phase 1's objective: the ordinary LM loss
        # F-neighbours change a token's value, never the number of sequences: the count is public.
        self.dpsgd = DpSgd(self.params.private, Population.public_by_adjacency(n_examples), randomness)
        self.noise_multiplier = self.dpsgd.noise_multiplier

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT) -> PrivacyStatement:
        """``data.redacted`` feeds phase 1; ``data`` phase 2, whose ``loss_fn`` must be per-example (DP-SGD)."""
        if data.redacted is None:
            raise ValueError("selective needs the redacted corpus (TrainData.redacted)")
        offset = self.params.public.steps
        if checkpoint.saved_scope() != "selective-private":  # a checkpoint of phase 2 means phase 1 is done
            public = TrainData(data.redacted, data.pad_id)
            Noiseless(self.params.public).train(
                model, public, self.public_loss, device,
                lambda r: on_round(RoundReport(r.round, r.loss, 0.0, self.params.private.delta)),
                checkpoint, scope="selective-public")
        second = self.dpsgd.train(
            model, data, loss_fn, device,
            lambda r: on_round(RoundReport(offset + r.round, r.loss, r.epsilon, r.delta)),
            checkpoint, scope="selective-private")
        return PrivacyStatement(
            mechanism=self.name, unit=self.unit, epsilon=second.epsilon, delta=second.delta,
            accountant=second.accountant, noise_multiplier=second.noise_multiplier,
            sampling_probability=second.sampling_probability, rounds=offset + second.rounds,
            notes=second.notes, extra={**second.extra, "public_steps": float(offset)},
            randomness=second.randomness, public=second.public, caveats=(*second.caveats, MISSED_TOKENS_CAVEAT),
        )
