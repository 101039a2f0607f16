"""``dpsgd``: example-level DP-SGD (Abadi et al. 2016); the privacy unit is one training sequence.

Per step: Poisson-sample sequences with ``q = expected_batch_size / N`` (each sequence by its own coin;
N is a public or DP count of sequences, :mod:`privacy.population`); each example's gradient is
clipped to ``clip`` in L2 over all trainable parameters (flat clipping) and the clipped gradients are
summed, by ghost clipping (:mod:`privacy.per_sample.ghost`, the default) or from Opacus' materialised
per-sample gradients (``per_sample="opacus"``); Gaussian noise with standard deviation ``z * clip`` is added
once to the sum, which is divided by the fixed expected batch size, and the optimizer (Adam, or any
other: post-processing) steps. An empty Poisson batch still adds noise and counts as a step.
Accounting: the DP count of sequences (if any), then ``steps``-fold ``PoissonSampled(q, Gaussian(z))``
by dp_accounting. Sampling and noise come from the run's :class:`privacy.randomness.Randomness`.
"""

from __future__ import annotations

from typing import Any, Literal

import dp_accounting
import torch

from uedp.models.batching import collate, like_length_groups
from uedp.models.device import autocast
from uedp.models.parallel import Ranks
from uedp.models.training import adam
from uedp.privacy.accounting.calibration import check_delta, resolve_noise_multiplier
from uedp.privacy.accounting.events import Adjacency, poisson_gaussian_round
from uedp.privacy.accounting.rounds import RoundAccountant
from uedp.privacy.layer_randomness import dropout_switched_off
from uedp.privacy.mechanisms.base import (
    NO_CHECKPOINT,
    Checkpointer,
    HostUnits,
    LossFn,
    OnRound,
    TrainData,
    Trained,
)
from uedp.privacy.mechanisms.loop import RoundLoop, RoundOutput, planned_epsilon, private_statement
from uedp.privacy.mechanisms.params import DpSgdParams
from uedp.privacy.per_sample import PerSampleClipping, per_sample_clipping
from uedp.privacy.population import Population
from uedp.privacy.primitives import noise_ahead
from uedp.privacy.randomness import Randomness, RandomSource, RoundRandomness
from uedp.privacy.signal import NoiseToSignal

__all__ = ["DpSgd", "DpSgdParams"]


class DpSgd:
    """DP-SGD's loop; subclasses change what an example is, its gradient and the per-step event."""

    name = "dpsgd"
    unit = DpSgdParams.unit_words
    loss_reduction: Literal["mean", "sum"] = "mean"  # how the loss combines examples (per-example scaling)

    adjacency: Adjacency = "add_remove"  # "replace" when the unit is a value inside a sequence (selective)

    def __init__(self, params: DpSgdParams, population: Population, randomness: Randomness | None = None):
        if population.value < 1:
            raise ValueError(f"{self.name} needs at least one training sequence")
        if self.adjacency == "replace" and params.accountant != "pld":
            raise ValueError("selective is accounted under replace-one adjacency, which only the pld accountant supports")
        self.params = params
        self.population = population
        self.randomness = randomness or Randomness.secure()
        self.sample_rate = min(1.0, params.batch_size / population.value)
        self.noise_multiplier = resolve_noise_multiplier(
            self.name, params.noise_multiplier, params.target_epsilon, self.round_event, params.steps, params.delta,
            params.accountant, self.adjacency, initial=population.event())

    def round_event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        """One step: the Poisson-sampled Gaussian release of the noised gradient sum."""
        return poisson_gaussian_round(self.sample_rate, noise_multiplier)

    def run_accountant(self) -> RoundAccountant:
        """The run's accountant: the DP count of the sequences, then one sampled Gaussian per step."""
        p = self.params
        return RoundAccountant(self.round_event(self.noise_multiplier), p.delta, p.accountant, self.adjacency,
                               initial=self.population.event())

    def planned_epsilon(self) -> float:
        """The epsilon this run will state if it runs its planned steps (or up to its budget stop)."""
        return planned_epsilon(self.run_accountant(), self.params.steps, self.params.max_epsilon)

    def train(self, model: torch.nn.Module, data: TrainData, loss_fn: LossFn, device: torch.device,
              on_round: OnRound, checkpoint: Checkpointer = NO_CHECKPOINT, scope: str | None = None) -> Trained:
        """``loss_fn`` must be a mean of per-example losses (``models.metrics.per_sequence_lm_loss``)."""
        p, z, q = self.params, self.noise_multiplier, self.sample_rate
        examples = self.examples(model, data)
        example_ids = data.sequence_ids
        check_delta(p.delta, round(self.population.value))
        accountant = self.run_accountant()
        with dropout_switched_off(model) as dropout:  # layers' own draws would be shared by all examples
            clipping = self.per_sample_clipping(model)
            params: list[torch.Tensor] = [q_ for q_ in model.parameters() if q_.requires_grad]
            optimizer = adam(params, p.lr)

            def one_step(step: int, rng: RoundRandomness) -> RoundOutput:
                batch = [examples[i] for i in rng.poisson_sample("sample-examples", example_ids, q)]
                gradients = self.step_gradient(clipping, model, params, batch, loss_fn, device, data.pad_id,
                                               rng.stream("noise"))
                for param, grad in zip(params, gradients):
                    param.grad = grad
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                return RoundOutput()  # neither the loss nor the batch size is released

            loop = RoundLoop(scope or self.name, p.steps, accountant, self.randomness, p.delta, p.max_epsilon, "step",
                             state={"model": model, "optimizer": optimizer})
            model.train()
            try:
                outcome = loop.run(one_step, on_round, checkpoint)
            finally:
                clipping.close()  # the caller gets its plain model back
        return Trained(private_statement(
            self.name, self.unit, accountant, outcome, delta=p.delta, accountant=p.accountant, noise_multiplier=z,
            sampling_probability=q, randomness=self.randomness, population=self.population,
            extra={"noise_std": z * p.clip, "sensitivity": p.clip, **self.statement_extra()},
            caveats=self.statement_caveats(), dropout_switched_off=dropout), sampling=self)

    def noise_to_signal(self, units: float) -> NoiseToSignal:
        """Noise ``z clip`` beside the expected batch's clipped gradients (``q`` times its own count of
        sequences, public or DP; ``units`` is for mechanisms without one)."""
        p = self.params
        return NoiseToSignal(self.name, self.noise_multiplier * p.clip, p.clip,
                             self.sample_rate * self.population.value, "adam", fixed_noise=p.target_epsilon is None)

    def rounds_with(self, units: HostUnits, rounds: range) -> int:
        """Steps of ``rounds`` whose Poisson batch takes one of ``units.sequences`` (audit canaries)."""
        return int(self.randomness.sampled_in("sample-examples", rounds, units.sequences, self.sample_rate).sum())

    def examples(self, model: torch.nn.Module, data: TrainData) -> list[Any]:
        """What Poisson sampling draws from: the training sequences."""
        return data.sequences

    def statement_extra(self) -> dict[str, float]:
        return {}

    def per_sample_clipping(self, model: torch.nn.Module) -> PerSampleClipping:
        """The engine that clips and sums per-example gradients (``params.per_sample``)."""
        return per_sample_clipping(model, self.params.per_sample, self.loss_reduction)

    def statement_caveats(self) -> tuple[str, ...]:
        """What this mechanism's epsilon does not cover, beyond what every run says."""
        return ()

    def step_gradient(self, clipping: PerSampleClipping, model: torch.nn.Module, params: list[torch.Tensor],
                      batch: list[Any], loss_fn: LossFn, device: torch.device, pad_id: int,
                      noise_gen: RandomSource) -> list[torch.Tensor]:
        return self.noisy_gradient(clipping, params, batch, loss_fn, device, pad_id, noise_gen)

    def noisy_gradient(self, clipping: PerSampleClipping, params: list[torch.Tensor], batch: list[torch.Tensor],
                       loss_fn: LossFn, device: torch.device, pad_id: int,
                       noise_gen: RandomSource) -> list[torch.Tensor]:
        """``(sum_i clip(g_i) + N(0, (z clip)^2 I)) / expected_batch_size``, per parameter.

        Under torchrun each process sums its share of the batch; the shares are added before the
        noise, which every process draws alike from the same generator. The noise is drawn on a background
        thread while the clipped sum is computed (:func:`privacy.primitives.noise_ahead`)."""
        sigma = self.noise_multiplier * self.params.clip
        ranks = Ranks.current()
        pending = noise_ahead(params, sigma, noise_gen)
        summed = ranks.sum_(self.clipped_gradient_sum(clipping, params, ranks.mine(batch), loss_fn, device, pad_id))
        noises = pending.result()
        # In place: the sums are this step's own tensors, and at 100M parameters every extra model-sized
        # temporary costs as much as drawing part of the noise.
        return [total.add_(noise).div_(self.params.batch_size) for total, noise in zip(summed, noises)]

    def clipped_gradient_sum(self, clipping: PerSampleClipping, params: list[torch.Tensor],
                             batch: list[torch.Tensor], loss_fn: LossFn, device: torch.device,
                             pad_id: int) -> list[torch.Tensor]:
        """``sum_i clip(g_i, clip)`` per parameter (flat clipping over all trainable parameters).

        The batch is summed in micro-batches of like lengths (:func:`models.batching.like_length_groups`), of at
        most ``max_physical_batch`` sequences where it is set: each example is clipped on its own, so the sum is
        the same; a pass computes less padding, and holds less memory."""
        def loss(model: torch.nn.Module, batch_inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            with autocast(device):  # the forward pass only: clipping works in float32
                return loss_fn(model, batch_inputs)

        # Added in at least float32, so that micro-batches of a bf16 model round no more than one batch.
        total: list[torch.Tensor] | None = None
        for micro_batch in like_length_groups(batch, self.params.max_physical_batch):
            inputs = {k: v.to(device) for k, v in collate(micro_batch, pad_id).items()}
            parts = clipping.clipped_sum(loss, inputs, len(micro_batch), self.params.clip)
            if total is None:
                total = [part.to(torch.promote_types(part.dtype, torch.float32)) for part in parts]
            else:
                for summed, part in zip(total, parts):
                    summed.add_(part)
        if total is None:  # an empty batch (Poisson sampling drew no sequence): the noise alone
            return [torch.zeros_like(param) for param in params]
        return [summed.to(param.dtype) for summed, param in zip(total, params)]
