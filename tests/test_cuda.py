"""What only a GPU can show: secret noise drawn on the device (keyed Philox, nothing of the model's size drawn on
the CPU), bf16 autocast's clipping and noise, and private training end to end on CUDA. Marked ``cuda``: `make
test` leaves them out, `make gpu-check` runs them (with the throughput benchmark at real sizes) on a machine
with a GPU. The CPU halves of these checks: tests/test_privacy_primitives.py, tests/test_mixed_precision.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from scipy import stats

from uedp.models.batching import encode
from uedp.models.metrics import per_sequence_lm_loss
from uedp.privacy import primitives
from uedp.privacy.mechanisms.dpsgd import DpSgd, DpSgdParams
from uedp.privacy.per_sample import per_sample_clipping
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness

from support import TOKENIZER, tiny_gpt2

pytestmark = pytest.mark.cuda
CUDA = torch.device("cuda")


def _chi_square_ok(samples: torch.Tensor, sigma: float) -> bool:
    n = samples.numel()
    statistic = float((samples.double() ** 2).sum()) / sigma**2
    return bool(stats.chi2.ppf(1e-6, n) <= statistic <= stats.chi2.ppf(1 - 1e-6, n))


def test_device_noise_is_drawn_on_the_gpu_with_std_sigma_and_only_a_seeded_root_replays_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_cpu_draw(*args: object) -> None:
        raise AssertionError("model-sized noise was drawn on the CPU for CUDA tensors")

    monkeypatch.setattr(primitives, "_parallel_standard_normal", no_cpu_draw)
    count = 2 * primitives.DEVICE_NOISE_VALUES + 12_345  # three chunks, three keys
    shapes = [torch.empty(count, device=CUDA), torch.empty(3, 4, device=CUDA, dtype=torch.bfloat16)]
    sigma = 2.5
    first = primitives.noise_ahead(shapes, sigma, Randomness.seeded(5).stream("noise", 4)).result()
    again = primitives.gaussian_noise_like(shapes, sigma, Randomness.seeded(5).stream("noise", 4))
    secure = primitives.gaussian_noise_like(shapes, sigma, Randomness.secure().stream("noise", 4))
    other = primitives.gaussian_noise_like(shapes, sigma, Randomness.secure().stream("noise", 4))
    assert [t.device.type for t in first] == ["cuda", "cuda"] and first[1].dtype == torch.bfloat16
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(secure[0], first[0]) and not torch.equal(secure[0], other[0])
    chunk = primitives.DEVICE_NOISE_VALUES
    pieces = [first[0][:chunk], first[0][chunk:2 * chunk], first[0][2 * chunk:], secure[0]]
    assert all(_chi_square_ok(piece, sigma) for piece in pieces)
    assert not _chi_square_ok(first[0], sigma**2)
    sample = 200_000
    correlation = float(torch.corrcoef(torch.stack([pieces[0][:sample], pieces[1][:sample]]))[0, 1])
    assert abs(correlation) < 5 / math.sqrt(sample)  # chunks keyed apart are independent


def test_dpsgd_on_cuda_clips_in_float32_under_bf16_autocast_and_adds_noise_of_std_z_clip() -> None:
    z, clip = 2.0, 1e-3
    texts = [f"writer {i} sent parcel {i} to harbour {i % 3}" for i in range(6)]
    mechanism = DpSgd(DpSgdParams(steps=1, batch_size=len(texts), clip=clip, noise_multiplier=z),
                      Population.declared(len(texts)), Randomness.secure())
    model = tiny_gpt2().to(CUDA)
    params = [p for p in model.parameters() if p.requires_grad]
    clipping = per_sample_clipping(model, "ghost")
    try:
        sums = [torch.cat([s.flatten() for s in mechanism.clipped_gradient_sum(
            clipping, params, encode(TOKENIZER, batch, 64), per_sequence_lm_loss, CUDA, TOKENIZER.pad_token_id)])
            for batch in (texts[1:], texts)]
        noisy = mechanism.noisy_gradient(clipping, params, encode(TOKENIZER, texts, 64), per_sequence_lm_loss, CUDA,
                                         TOKENIZER.pad_token_id, Randomness.secure().stream("noise", 1))
    finally:
        clipping.close()
    assert all(s.dtype == torch.float32 and s.device.type == "cuda" for s in sums)
    assert 0.5 * clip < float(torch.linalg.vector_norm((sums[1] - sums[0]).double())) <= clip * (1 + 1e-3)
    noise = torch.cat([g.flatten() for g in noisy]).double() * len(texts) - sums[1].double()
    assert float(noise.std()) == pytest.approx(z * clip, rel=0.02)


@pytest.mark.parametrize("mechanism", ["dpsgd", "userdp"])
def test_a_private_run_trains_on_cuda_end_to_end(tmp_path: Path, mechanism: str) -> None:
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.services.config import TrainConfig
    from uedp.services.detect import detect_entities
    from uedp.services.launch import run_training
    from uedp.storage.home import DataHome
    from uedp.storage.ingest import IngestOptions, ingest

    home = DataHome.from_env(tmp_path / "home")
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    config = TrainConfig.for_mechanism(mechanism, dataset="demo", device="cuda", steps=4, rounds=2, q_user=0.5,
                                       checkpoint_every=0)
    result = run_training(home, config)
    assert math.isfinite(result.epsilon) and result.epsilon > 0
    assert math.isfinite(result.utility_test)
