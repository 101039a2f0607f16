"""DP-SGD: exact per-example gradients (Opacus' path), clipping and sensitivity and noise scale on both
per-example engines (ghost clipping and Opacus), accounting against dp_accounting and Opacus' own
accountant, training, seeds. The ghost engine's per-layer exactness is in test_ghost_clipping.py."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from opacus import GradSampleModule
from opacus.accountants import RDPAccountant
from scipy import stats
from torch.nn.utils import parameters_to_vector

from uedp.models.batching import collate, encode
from uedp.models.metrics import per_sequence_lm_loss, perplexity
from uedp.privacy.accounting.events import epsilon_after, poisson_gaussian_round
from uedp.privacy.mechanisms.base import TrainData
from uedp.privacy.mechanisms.dpsgd import DpSgd, DpSgdParams
from uedp.privacy.per_sample import per_sample_clipping
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness

from support import TOKENIZER
from support import tiny_gpt2 as _model

TEXTS = ["hello world", "Anna Berg lives in Leeds", "x", "call +44 7700 900123 today please"]


def _private(model: torch.nn.Module) -> GradSampleModule:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GradSampleModule(model, strict=False, loss_reduction="mean")


def _data(n: int = 40) -> TrainData:
    texts = [f"note {i}: the clinic in Leeds called about tablets" for i in range(n)]
    return TrainData({"all": encode(TOKENIZER, texts, 64)}, TOKENIZER.pad_token_id)


def test_per_example_gradients_equal_single_example_gradients() -> None:
    private = _private(_model())
    per_sequence_lm_loss(private, collate(encode(TOKENIZER, TEXTS, 48), TOKENIZER.pad_token_id)).backward()
    for i, text in enumerate(TEXTS):
        ref = _model()
        per_sequence_lm_loss(ref, collate(encode(TOKENIZER, [text], 48), TOKENIZER.pad_token_id)).backward()
        for (name, p), (_, r) in zip(private.named_parameters(), ref.named_parameters()):
            assert torch.allclose(p.grad_sample[i], r.grad, atol=1e-6, rtol=1e-4), name


ENGINES = ("ghost", "opacus")


@pytest.mark.parametrize("engine", ENGINES)
def test_clipped_sum_moves_by_at_most_clip_when_one_example_is_added(engine: str) -> None:
    mechanism = DpSgd(DpSgdParams(clip=0.01, expected_batch_size=4, per_sample=engine), Population.declared(10))
    seqs = encode(TOKENIZER, TEXTS, 48)

    def summed(batch: list[torch.Tensor]) -> torch.Tensor:
        model = _model()
        clipping = mechanism.per_sample_clipping(model)
        params = [p for p in model.parameters() if p.requires_grad]
        out = mechanism.clipped_gradient_sum(clipping, params, batch, per_sequence_lm_loss, torch.device("cpu"),
                                             TOKENIZER.pad_token_id)
        clipping.close()
        return torch.cat([t.reshape(-1) for t in out])

    base, added = summed(seqs[:3]), summed(seqs)
    moved = float(torch.linalg.vector_norm(added - base))
    assert moved <= 0.01 * (1 + 1e-4) and moved > 0.99 * 0.01  # clipping was active and bounds the change
    assert float(torch.linalg.vector_norm(summed(seqs[:1]))) <= 0.01 * (1 + 1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_noise_standard_deviation_is_z_times_clip_over_expected_batch(engine: str) -> None:
    z, clip, batch = 1.7, 0.5, 8
    mechanism = DpSgd(DpSgdParams(noise_multiplier=z, clip=clip, expected_batch_size=batch, per_sample=engine),
                      Population.declared(100))
    model = _model()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = mechanism.noisy_gradient(per_sample_clipping(model, engine), params, [], per_sequence_lm_loss, torch.device("cpu"),
                                     TOKENIZER.pad_token_id, torch.Generator().manual_seed(2))
    noise = torch.cat([g.reshape(-1) for g in grads]).double() * batch  # empty batch: pure noise
    chi = float((noise**2).sum()) / (z * clip) ** 2
    assert stats.chi2.ppf(1e-6, noise.numel()) <= chi <= stats.chi2.ppf(1 - 1e-6, noise.numel())


def test_epsilon_per_step_matches_dp_accounting_and_opacus() -> None:
    data = _data(40)
    reports: list = []
    params = DpSgdParams(steps=5, expected_batch_size=4, noise_multiplier=1.1, accountant="rdp")
    statement = DpSgd(params, Population.declared(40)).train(_model(), data, per_sequence_lm_loss, torch.device("cpu"), reports.append).statement
    q = 4 / 40
    assert [r.epsilon for r in reports] == pytest.approx(
        [epsilon_after(poisson_gaussian_round(q, 1.1), t, 1e-5, "rdp") for t in range(1, 6)], rel=1e-12)
    opacus = RDPAccountant()
    opacus.history = [(1.1, q, 5)]
    assert statement.epsilon == pytest.approx(opacus.get_epsilon(1e-5), rel=0.05)


@pytest.mark.parametrize("engine", ENGINES)
def test_dpsgd_trains_and_is_reproducible(engine: str) -> None:
    data = _data(60)
    params = DpSgdParams(steps=40, expected_batch_size=12, noise_multiplier=0.6, clip=1.0, lr=3e-3, accountant="rdp",
                         per_sample=engine)
    a, b = _model(), _model()
    before = perplexity(a, data.sequences, data.pad_id, torch.device("cpu"))
    statement = DpSgd(params, Population.declared(60), Randomness.seeded(1)).train(a, data, per_sequence_lm_loss, torch.device("cpu"), lambda r: None).statement
    DpSgd(params, Population.declared(60), Randomness.seeded(1)).train(b, data, per_sequence_lm_loss, torch.device("cpu"), lambda r: None)
    assert perplexity(a, data.sequences, data.pad_id, torch.device("cpu")) < 0.5 * before
    assert torch.equal(parameters_to_vector(a.parameters()), parameters_to_vector(b.parameters()))
    assert math.isfinite(statement.epsilon) and statement.rounds == 40
    assert not any(hasattr(m, "_forward_hooks") and m._forward_hooks for m in a.modules())  # hooks removed
