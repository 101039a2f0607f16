"""Tokenizer, model loading through the real from_pretrained path, batching and perplexity."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from uedp.errors import UedpError
from uedp.models.batching import collate, encode
from uedp.models.gpt2 import build_gpt2, load_gpt2
from uedp.models.metrics import perplexity
from uedp.models.tokenization import byte_level_tokenizer, load_tokenizer
from uedp.privacy.deid import redact


def test_byte_tokenizer_roundtrips_any_text_and_has_no_learned_merges(tmp_path: Path) -> None:
    tokenizer = byte_level_tokenizer()
    text = "Dr. Imelda Okafor, +44 7700 900123, zoë@post.example"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode("utf-8"))  # one token per byte: no vocabulary learned from data
    assert tokenizer.decode(ids) == text
    tokenizer.save_pretrained(tmp_path / "tok")
    reloaded = load_tokenizer(tmp_path / "tok")
    assert reloaded(text, add_special_tokens=False)["input_ids"] == ids


def test_gpt2_saves_and_loads_with_from_pretrained(tmp_path: Path) -> None:
    tokenizer = byte_level_tokenizer()
    model = build_gpt2("tiny", len(tokenizer), tokenizer.eos_token_id)
    model.save_pretrained(tmp_path / "gpt2")
    loaded = load_gpt2(tmp_path / "gpt2")
    batch = collate(encode(tokenizer, ["hello world"], 32), tokenizer.pad_token_id)
    with torch.no_grad():
        assert torch.allclose(model(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits,
                              loaded(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits)
    with pytest.raises(UedpError, match="cannot load GPT-2 weights"):
        load_gpt2(tmp_path / "missing")


def test_a_checkpoint_of_another_architecture_is_refused_naming_both(tmp_path: Path) -> None:
    """A Llama folder passed where a GPT-2 is asked used to load as a GPT-2 with every weight new."""
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(tmp_path / "llama")
    with pytest.raises(UedpError, match=r"holds a llama checkpoint \(LlamaForCausalLM\), not a GPT-2 one"):
        load_gpt2(tmp_path / "llama")


def test_a_checkpoint_missing_weights_is_refused_naming_one(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    tokenizer = byte_level_tokenizer()
    build_gpt2("tiny", len(tokenizer), tokenizer.eos_token_id).save_pretrained(tmp_path / "gpt2")
    weights = tmp_path / "gpt2" / "model.safetensors"
    tensors = load_file(weights)
    del tensors["transformer.h.1.mlp.c_fc.weight"]
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(UedpError, match=r"1 weight\(s\) the model needs are not in the checkpoint "
                                        r"\(e.g. transformer.h.1.mlp.c_fc.weight\)"):
        load_gpt2(tmp_path / "gpt2")


def test_an_encoder_loads_with_a_fresh_head_but_not_with_missing_layers(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file
    from transformers import BertConfig, BertModel

    from uedp.models.classifier import load_classifier

    BertModel(BertConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2)).save_pretrained(tmp_path / "encoder")
    assert load_classifier(tmp_path / "encoder", num_labels=3).config.num_labels == 3  # the head starts fresh
    weights = tmp_path / "encoder" / "model.safetensors"
    tensors = load_file(weights)
    dropped = next(name for name in tensors if "attention.self.query.weight" in name)
    del tensors[dropped]
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(UedpError, match="1 weight\\(s\\) the model needs are not in the checkpoint"):
        load_classifier(tmp_path / "encoder", num_labels=3)


def test_perplexity_is_token_weighted_and_uniform_model_gives_vocab_size() -> None:
    tokenizer = byte_level_tokenizer()
    model = build_gpt2("tiny", len(tokenizer), tokenizer.eos_token_id)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()  # all logits equal: perplexity must be exactly the vocabulary size
    seqs = encode(tokenizer, ["a", "a much longer sentence than the first"], 64)
    ppl = perplexity(model, seqs, tokenizer.pad_token_id, torch.device("cpu"), batch_size=1)
    assert math.isclose(ppl, len(tokenizer), rel_tol=1e-4)


def test_redact_replaces_spans_with_category_placeholders() -> None:
    text = "Call Amara Szabo on +44 7700 900123 ."
    assert redact(text, [(5, 16, "PER"), (20, 35, "PHONE")]) == "Call [PER] on [PHONE] ."
    assert redact(text, []) == text
    assert redact("abcdef", [(0, 3, "A"), (2, 5, "B")]) == "[A]f"
