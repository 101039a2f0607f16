"""LoRA under every private mechanism releases only the adapters' noised update: a pretrained folder's own
weights (public, frozen) come out of training bit for bit as they went in, and every adapter matrix moved
(noise reaches all of them). Each mechanism trains for real: its own secure randomness, clipping and noise,
on a Llama-family checkpoint folder as users download one. A run that lets one frozen weight train is
caught by the same check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from uedp.models.batching import encode
from uedp.models.causal_lm import load_causal_lm
from uedp.models.lora import LoraSettings, with_lora
from uedp.models.metrics import causal_lm_loss, per_sequence_lm_loss
from uedp.privacy.mechanisms.base import TrainData
from uedp.privacy.mechanisms.dpsgd import DpSgd, DpSgdParams
from uedp.privacy.mechanisms.params import UeDpBoundedParams
from uedp.privacy.mechanisms.uedp import UeDp, UeDpParams
from uedp.privacy.mechanisms.uedp_bounded import UeDpBounded
from uedp.privacy.mechanisms.userdp import UserDp, UserDpParams
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness

from support import TOKENIZER

CPU = torch.device("cpu")
ENTITY = "PERSON:imelda okafor"


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llama-download")
    ids = {"vocab_size": len(TOKENIZER), "bos_token_id": TOKENIZER.eos_token_id,
           "eos_token_id": TOKENIZER.eos_token_id, "pad_token_id": TOKENIZER.eos_token_id}
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=128, **ids)).save_pretrained(folder)
    return folder


def _data(users: int = 8) -> TrainData:
    """Writers of two sentences each; the first half name one shared entity (uedp trains only those)."""
    by_user, sets = {}, {}
    for u in range(users):
        names = u < users // 2
        texts = [f"writer {u} noted the ferry left at {7 + u}", f"Imelda Okafor signed chart {u}" if names else "rain"]
        by_user[f"w{u}"] = encode(TOKENIZER, texts, 48)
        sets[f"w{u}"] = [frozenset(), frozenset({ENTITY}) if names else frozenset()]
    return TrainData(by_user, TOKENIZER.pad_token_id, sets)


def _train(mechanism: str, model: torch.nn.Module) -> None:
    root, data = Randomness.secure(), _data()
    if mechanism == "dpsgd":
        DpSgd(DpSgdParams(steps=2, batch_size=4, clip=0.1, noise_multiplier=1.0, accountant="rdp"),
              Population.declared(16), root).train(model, data, per_sequence_lm_loss, CPU, lambda r: None)
    elif mechanism == "userdp":
        UserDp(UserDpParams(rounds=2, q_user=1.0, clip=0.1, noise_multiplier=1.0, local_steps=1, local_batch_size=2,
                            accountant="rdp"), Population.declared(8), root).train(
            model, data, causal_lm_loss, CPU, lambda r: None)
    elif mechanism == "uedp-bounded":
        UeDpBounded(UeDpBoundedParams(rounds=2, q_user=1.0, clip=0.1, noise_multiplier=1.0, local_steps=1,
                                      local_batch_size=2, holders_per_entity=2), root).train(
            model, data, causal_lm_loss, CPU, lambda r: None)
    else:
        UeDp(UeDpParams(rounds=2, q_user=1.0, q_entity=1.0, q_extended=1.0, noise_multiplier=1.0, local_steps=1,
                        accountant="rdp"), Population.declared(4), root).train(
            model, data, causal_lm_loss, CPU, lambda r: None)


def _lora_model(folder: Path) -> torch.nn.Module:
    model = with_lora(load_causal_lm(folder), LoraSettings(rank=2, alpha=4.0))
    for name, param in model.named_parameters():  # peft starts B at 0; a nonzero B gives A a gradient too
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.02)
    return model


def _released_only_the_adapters(before: dict[str, torch.Tensor], model: torch.nn.Module,
                                frozen: set[str]) -> None:
    after = {name: p.detach() for name, p in model.named_parameters()}
    changed_frozen = [name for name in frozen if not torch.equal(before[name], after[name])]
    assert not changed_frozen, f"frozen weights changed: {changed_frozen[:3]}"
    adapters = [name for name in after if "lora_" in name]
    assert adapters and all(not torch.equal(before[n], after[n]) for n in adapters)  # the noise reached each


@pytest.mark.parametrize("mechanism", ["dpsgd", "userdp", "uedp-bounded", "uedp"])
def test_a_lora_run_changes_only_its_adapters_and_every_one_of_them(llama_folder: Path, mechanism: str) -> None:
    model = _lora_model(llama_folder)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    assert frozen and all("lora_" not in name for name in frozen)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    _train(mechanism, model)
    _released_only_the_adapters(before, model, frozen)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) < 0.1 * sum(
        p.numel() for p in model.parameters())


def test_a_frozen_weight_left_trainable_is_caught(llama_folder: Path) -> None:
    """The check fails when a weight the release treats as the public start trains after all."""
    model = _lora_model(llama_folder)
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    leaked = next(name for name in frozen if "embed_tokens" in name)
    dict(model.named_parameters())[leaked].requires_grad_(True)  # a LoRA wrapper that forgot to freeze it
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    _train("userdp", model)
    with pytest.raises(AssertionError, match="frozen weights changed"):
        _released_only_the_adapters(before, model, frozen)
