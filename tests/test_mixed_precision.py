"""bf16 autocast, as DP-SGD's forward pass runs on CUDA (models.device.autocast), checked on the CPU's own bf16
autocast: per-example norms, clipping and the noise stay in float32 or better, so the sensitivity the accountant
assumes holds whatever precision the layers compute in. The same checks on a GPU: tests/test_cuda.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from uedp.models.batching import collate, encode
from uedp.models.device import autocast, training_precision
from uedp.models.metrics import per_sequence_lm_loss
from uedp.privacy.mechanisms import dpsgd as dpsgd_module
from uedp.privacy.mechanisms.dpsgd import DpSgd, DpSgdParams
from uedp.privacy.per_sample import per_sample_clipping
from uedp.privacy.per_sample.exact import ExactClipping
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness

from support import TOKENIZER

CPU = torch.device("cpu")
TEXTS = [f"writer {i} noted that the ferry to harbour {i % 3} left at {7 + i} with {i} parcels aboard" for i in range(6)]


@contextlib.contextmanager
def cpu_bf16() -> Iterator[None]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yield


def _model(family: str) -> torch.nn.Module:
    ids = {"vocab_size": len(TOKENIZER), "bos_token_id": TOKENIZER.eos_token_id, "eos_token_id": TOKENIZER.eos_token_id}
    torch.manual_seed(0)
    if family == "gpt2":
        config = GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, pad_token_id=TOKENIZER.eos_token_id, **ids)
        return GPT2LMHeadModel(config)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=128, **ids)
    return LlamaForCausalLM(config)


def _batch(texts: list[str]) -> dict[str, torch.Tensor]:
    return collate(encode(TOKENIZER, texts, 64), TOKENIZER.pad_token_id)


def _bf16_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    with cpu_bf16():
        return per_sequence_lm_loss(model, batch)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_bf16_forward_gives_float64_norms_near_the_float32_ones_and_float32_clipped_sums(family: str) -> None:
    """The layers really ran in bf16 (norms differ from float32 ones), yet the norms are float64 and within a
    few percent of the exact float32 per-example norms, and the clipped sum is float32 like the weights."""
    model = _model(family)
    batch = _batch(TEXTS)
    with cpu_bf16():
        assert model(input_ids=batch["input_ids"]).logits.dtype == torch.bfloat16  # autocast is really on
    exact = ExactClipping(model).per_example_norms(per_sequence_lm_loss, batch, len(TEXTS))
    ghost = per_sample_clipping(model, "ghost")
    try:
        norms = ghost.per_example_norms(_bf16_loss, batch, len(TEXTS))  # type: ignore[attr-defined]
        sums = ghost.clipped_sum(_bf16_loss, batch, len(TEXTS), clip=1e-3)
    finally:
        ghost.close()
    assert norms.dtype == torch.float64
    assert not torch.allclose(norms, exact.to(norms.dtype), rtol=1e-6, atol=0)  # bf16 did change something
    assert torch.allclose(norms, exact.to(norms.dtype), rtol=0.05, atol=0)
    assert all(s.dtype == torch.float32 and bool(torch.isfinite(s).all()) for s in sums)


@pytest.mark.parametrize(("family", "engine"), [("gpt2", "ghost"), ("llama", "ghost"), ("gpt2", "opacus")])
def test_under_bf16_adding_one_example_moves_dpsgds_clipped_sum_by_at_most_clip(family: str, engine: str) -> None:
    """DP-SGD's own path (DpSgd.clipped_gradient_sum) under a run's ``--precision bf16`` (the CPU's own bf16
    autocast, models.device.training_precision): every example is clipped (clip far below the norms),
    D' = D + one example moves the sum by at most clip (up to float32 rounding), and a single example's
    contribution has norm clip. Opacus' path too: its hooks give bf16 per-sample gradients under autocast, which
    it must clip in float32 at least (in bf16 one contribution reached 1.006 clip)."""
    clip = 1e-3
    mechanism = DpSgd(DpSgdParams(steps=1, batch_size=len(TEXTS), clip=clip, noise_multiplier=1.0),
                      Population.declared(len(TEXTS)), Randomness.secure())
    model = _model(family)
    params = [p for p in model.parameters() if p.requires_grad]
    clipping = per_sample_clipping(model, engine)  # type: ignore[arg-type]
    forward_dtypes: list[torch.dtype] = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, out: forward_dtypes.append(out.dtype))
    try:
        flat = []
        with training_precision("bf16"):
            for texts in (TEXTS[1:], TEXTS, TEXTS[:1]):
                sums = mechanism.clipped_gradient_sum(clipping, params, encode(TOKENIZER, texts, 64),
                                                      per_sequence_lm_loss, CPU, TOKENIZER.pad_token_id)
                assert all(s.dtype == torch.float32 for s in sums)
                flat.append(torch.cat([s.flatten() for s in sums]).double())
    finally:
        clipping.close()
        hook.remove()
    assert forward_dtypes and set(forward_dtypes) == {torch.bfloat16}  # the forward pass did run in bf16
    moved = float(torch.linalg.vector_norm(flat[1] - flat[0]))
    # up to the float32 rounding of the other examples' contributions, summed in another batch shape
    assert 0.5 * clip < moved <= clip * (1 + 1e-3)
    assert float(torch.linalg.vector_norm(flat[2])) == pytest.approx(clip, rel=1e-4)


def test_under_bf16_dpsgds_noise_is_float32_with_standard_deviation_z_clip(monkeypatch: pytest.MonkeyPatch) -> None:
    """The noisy gradient of a bf16-forward step: (clipped sum + N(0, (z C)^2)) / B in float32; the noise part,
    recovered by subtracting the clipped sum, has standard deviation z C (not a bf16-rounded one)."""
    monkeypatch.setattr(dpsgd_module, "autocast", lambda device: cpu_bf16())
    z, clip, batch_size = 2.0, 1e-3, len(TEXTS)
    mechanism = DpSgd(DpSgdParams(steps=1, batch_size=batch_size, clip=clip, noise_multiplier=z),
                      Population.declared(batch_size), Randomness.secure())
    model = _model("gpt2")
    params = [p for p in model.parameters() if p.requires_grad]
    examples = encode(TOKENIZER, TEXTS, 64)
    clipping = per_sample_clipping(model, "ghost")
    try:
        summed = mechanism.clipped_gradient_sum(clipping, params, examples, per_sequence_lm_loss, CPU,
                                                TOKENIZER.pad_token_id)
        noisy = mechanism.noisy_gradient(clipping, params, examples, per_sequence_lm_loss, CPU,
                                         TOKENIZER.pad_token_id, Randomness.secure().stream("noise", 1))
    finally:
        clipping.close()
    assert all(g.dtype == torch.float32 for g in noisy)
    noise = torch.cat([(g * batch_size - s).flatten() for g, s in zip(noisy, summed)]).double()
    assert float(noise.std()) == pytest.approx(z * clip, rel=0.02)
    # float32 noise takes ~2^24 distinct magnitudes; bf16-rounded noise would take a few hundred
    assert torch.unique(noise[:20_000].float()).numel() > 19_000


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # autocast("cuda") is only built here, never entered
def test_a_runs_precision_chooses_the_training_forward_pass_and_nothing_else() -> None:
    """``--precision``: auto keeps today's choice (bf16 on CUDA, float32 on a CPU), bf16 asks for it on any device,
    float32 refuses it on a GPU too; the choice is the run's context, gone after it and unseen by other threads."""
    import threading

    layer, x = torch.nn.Linear(8, 8), torch.randn(2, 8)

    def forward_dtype() -> torch.dtype:
        with autocast(CPU):
            return layer(x).dtype

    assert forward_dtype() == torch.float32  # auto on a CPU
    with training_precision("bf16"):
        assert forward_dtype() == torch.bfloat16
        seen: list[torch.dtype] = []
        worker = threading.Thread(target=lambda: seen.append(forward_dtype()))
        worker.start()
        worker.join()
        assert seen == [torch.float32]  # another thread (another run's task) keeps its own
    assert forward_dtype() == torch.float32  # reset on the way out
    with training_precision("float32"):
        assert isinstance(autocast(torch.device("cuda")), contextlib.nullcontext)
    assert not isinstance(autocast(torch.device("cuda")), contextlib.nullcontext)  # auto: bf16 on a GPU


def test_precision_is_a_setting_and_auto_keeps_every_fingerprint() -> None:
    from uedp.services.config import TrainConfig

    base = TrainConfig.for_mechanism("dpsgd", dataset="demo", steps=2, noise_multiplier=1.0)
    assert TrainConfig.for_mechanism("dpsgd", dataset="demo", steps=2, noise_multiplier=1.0,
                                     precision="auto").fingerprint() == base.fingerprint()
    bf16 = TrainConfig.for_mechanism("dpsgd", dataset="demo", steps=2, noise_multiplier=1.0, precision="bf16")
    assert bf16.fingerprint() != base.fingerprint()  # another configuration: not found again for a float32 one
    assert bf16.settings()["precision"] == "bf16"  # and reports do not average it with float32 runs


def test_a_torchrun_replica_trains_in_its_runs_precision(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Every rank, not the main process alone: a replica (services.training.train_replica) trains its share of
    each round in the configuration's precision."""
    from types import SimpleNamespace

    from uedp.models import device as device_module
    from uedp.services import training
    from uedp.services.config import TrainConfig
    from uedp.storage.home import DataHome

    config = TrainConfig.for_mechanism("dpsgd", dataset="demo", steps=2, noise_multiplier=1.0, precision="bf16")
    seen: list[str] = []
    mechanism = SimpleNamespace(train=lambda *args: seen.append(device_module._PRECISION.get()))
    monkeypatch.setattr(training, "set_up", lambda home, config, ranks: SimpleNamespace(
        mechanism=mechanism, model=None, data=SimpleNamespace(train=[]), config=config, device=CPU, checkpoint=None))
    training.train_replica(DataHome.from_env(tmp_path / "home"), config)
    assert seen == ["bf16"] and device_module._PRECISION.get() == "auto"
