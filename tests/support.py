"""Helpers the tests share: plain functions and constants (fixtures live in conftest.py). Nothing here is a
test; test files import from here, never from each other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from uedp.models.batching import encode
from uedp.models.gpt2 import build_gpt2
from uedp.models.tokenization import byte_level_tokenizer
from uedp.privacy.mechanisms.base import TrainData

REPO = Path(__file__).resolve().parents[1]
# The one folder outside the repository tests may read: the CoNLL-2003 files documented in the README,
# checked out beside the repository. Tests that need them take the ``shared_conll`` fixture (skipped
# with the reason when absent).
SHARED_CONLL = REPO.parent / "shared" / "data" / "conll2003"
TOKENIZER = byte_level_tokenizer()


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def tiny_gpt2(seed: int = 0) -> torch.nn.Module:
    """The smallest GPT-2 the models offer, with the byte-level tokenizer's vocabulary."""
    torch.manual_seed(seed)
    return build_gpt2("tiny", len(TOKENIZER), TOKENIZER.eos_token_id)


def tiny_causal_models() -> dict[str, torch.nn.Module]:
    """One tiny model of each kind uedp samples and scores with the byte-level vocabulary: a GPT-2, a Llama, a
    LoRA-wrapped Llama whose adapters change its outputs, and the LSTM (the one without a key/value cache)."""
    from uedp.models.factory import build_model
    from uedp.models.lora import LoraSettings, with_lora

    torch.manual_seed(0)
    llama = build_model("llama", "tiny", TOKENIZER)
    torch.manual_seed(0)
    lora = with_lora(build_model("llama", "tiny", TOKENIZER), LoraSettings(rank=2, alpha=4.0))
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)  # adapters that change the outputs
    return {"gpt2": tiny_gpt2(), "llama": llama, "llama+lora": lora, "lstm": build_model("lstm", "tiny", TOKENIZER)}


def fedavg_data(users: int = 12, per_user: int = 4) -> TrainData:
    """``users`` users with ``per_user`` short sentences each, encoded for the tiny GPT-2."""
    texts = {f"u{u}": [f"user {u} wrote message {i} about Leeds" for i in range(per_user)] for u in range(users)}
    return TrainData({u: encode(TOKENIZER, t, 48) for u, t in texts.items()}, TOKENIZER.pad_token_id)


# The original ag_news_csv layout: no header, every field quoted, backslashes where line breaks were,
# bare '#39;' entities, a doubled quote, and a quoted field spanning two physical lines.
AG_CSV = r'''"3","Orchard Foods Lifts Forecast (Reuters)","Reuters - Orchard Foods raised its annual\forecast on Tuesday, citing strong demand for\its frozen meals."
"4","Probe Finds Ice on Distant Moon (SPACE.com)","SPACE.com - A small probe has found what looks like\ice near the south pole of a distant moon, scientists said."
"2","Kestrel Wins Relay Final (AP)","AP - Tamsin Kestrel anchored the relay team to a win on Sunday night."
"1","Talks Resume in ""Harbour"" Dispute","TAMPERE (AFP) -- Negotiators returned to the table on Monday #39;s
agenda &amp; schedule."
"3","Markets Flat","No credit line here, markets were flat."
'''

WIKI = """ 
 = Harbourline Lighthouse = 
 
 The Harbourline Lighthouse is a 32 @-@ metre tower on the coast of <unk> . It was built in 1 @,@ 872 and restored in 1990 . 
 
 = = History = = 
 
 Keepers lived there until 1961 . 
 
 = Orchard Valley Railway = 
 
 The Orchard Valley Railway ( OVR ) is a heritage line , 9 @.@ 5 km long . 
"""


# Public made-up sentences a test checkpoint's tokenizer learns its merges from (never the private data).
_PUBLIC_TEXT = [f"the {thing} in {place} was {state} on day {day}" for thing in ("harbour", "railway", "market", "orchard")
                for place in ("the north", "a valley", "the old town") for state in ("busy", "quiet", "closed")
                for day in range(3)]


def checkpoint_tokenizer(vocab_size: int = 320) -> Any:
    """A small BPE tokenizer with its own merges, as a downloaded checkpoint ships one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator(_PUBLIC_TEXT, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="</s>")


def tiny_checkpoint(folder: Path, family: str = "llama", seed: int = 0, num_labels: int | None = None) -> Path:
    """A tiny random checkpoint of a real architecture saved as users download one: config, weights and
    its own tokenizer (``family``: llama, qwen2, mistral, gemma or gpt2); a sequence classifier of
    ``num_labels`` classes when given."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    tokenizer = checkpoint_tokenizer()
    shape = ({"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 128} if family == "gpt2" else
             {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 128, "head_dim": 8})
    # Embedding rows to spare, as real checkpoints have (Qwen2's tokenizer class adds a token of its own).
    config = AutoConfig.for_model(family, vocab_size=len(tokenizer) + 16, bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                  **({"num_labels": num_labels} if num_labels else {}), **shape)
    torch.manual_seed(seed)
    auto = AutoModelForSequenceClassification if num_labels else AutoModelForCausalLM
    auto.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def demo_halves(folder: Path) -> tuple[Path, Path]:
    """The bundled demo corpus cut at a -DOCSTART- line into two CoNLL files that share no writer and no
    sentence: a "private" text and a "public" one whose runs may start the private one's."""
    from uedp.flows.demo import DEMO_CORPUS

    text = DEMO_CORPUS.read_text(encoding="utf-8")
    documents = text.split("-DOCSTART-")
    cut = len(documents) // 2
    first, second = "-DOCSTART-".join(documents[:cut]), "-DOCSTART-" + "-DOCSTART-".join(documents[cut:])
    return write(folder / "private.conll", first), write(folder / "public.conll", second)


def demo_vectors(path: Path) -> Path:
    """A word-vector file (GloVe's text format) of random 8-dimensional vectors for every word and mark of
    the demo corpus: what the local-DP sanitizers need to draw a release of it."""
    import re

    import numpy as np

    from uedp.flows.demo import DEMO_CORPUS

    words = sorted({w for w in re.findall(r"\w+|[^\w\s]", DEMO_CORPUS.read_text()) if w.strip()})
    rng = np.random.default_rng(0)
    return write(path, "".join(f"{w} " + " ".join(f"{x:.4f}" for x in rng.normal(size=8)) + "\n"
                               for w in words if "DOCSTART" not in w))


def reuters_sgml(articles: list[dict[str, Any]]) -> str:
    """A Reuters-21578 SGML file (``reut2-NNN.sgm``) of ``articles``: each a dict with ``id``, ``split``
    (TRAIN, TEST or NOT-USED), ``title``, ``body`` (paragraphs), and optional ``author`` and ``places``/
    ``people``/``orgs`` lists, laid out as the distribution's files are (control characters, ``&lt;``, the
    indented paragraphs and the ``Reuter`` sign-off included)."""
    out = ['<!DOCTYPE lewis SYSTEM "lewis.dtd">']
    for a in articles:
        tags = "".join(f"<{t.upper()}>{''.join(f'<D>{v}</D>' for v in a.get(t, []))}</{t.upper()}>\n"
                       for t in ("topics", "places", "people", "orgs", "exchanges", "companies"))
        author = f"<AUTHOR>    by {a['author']}, Reuters</AUTHOR>\n" if a.get("author") else ""
        body = "\n    ".join(a["body"]).replace("<", "&lt;")
        out.append(f'<REUTERS TOPICS="YES" LEWISSPLIT="{a["split"]}" CGISPLIT="TRAINING-SET" OLDID="{5000 + a["id"]}" '
                   f'NEWID="{a["id"]}">\n<DATE>26-FEB-1987 15:01:01.79</DATE>\n{tags}'
                   f"<UNKNOWN> \n&#5;&#5;&#5;C T\n&#22;&#22;&#1;f0704&#31;reute\nu f BC-X  02-26 0105</UNKNOWN>\n"
                   f"<TEXT>&#2;\n<TITLE>{a['title']}</TITLE>\n{author}<DATELINE>    LONDON, Feb 26 - </DATELINE>"
                   f"<BODY>{body}\n Reuter\n&#3;</BODY></TEXT>\n</REUTERS>")
    return "\n".join(out) + "\n"


def reuters_corpus(folder: Path, articles: int = 40, seed: int = 0) -> list[Path]:
    """Two small generated Reuters-21578 files (train, test and not-used articles; a few with authors),
    in the distribution's own format."""
    import random

    rng = random.Random(seed)
    goods, places = ["cocoa", "coffee", "sugar", "wheat", "copper"], ["usa", "uk", "brazil", "japan"]
    made: list[dict[str, Any]] = []
    for i in range(1, articles + 1):
        good, place = rng.choice(goods), rng.choice(places)
        made.append({"id": i, "split": "TEST" if i % 5 == 0 else "NOT-USED" if i % 13 == 0 else "TRAIN",
                     "title": f"{good.upper()} PRICES {rng.choice(['RISE', 'FALL'])} IN {place.upper()}",
                     "author": "Janie Gabbett" if i % 7 == 0 else None, "places": [place], "topics": [good],
                     "body": [f"Prices of {good} in {place} moved {rng.randint(1, 9)} pct this week, traders said.",
                              f"The {good} market expects more supply from {rng.choice(places)} next month.",
                              f"Dealers said demand for {good} was steady."]})
    half = len(made) // 2
    return [write(folder / "reut2-000.sgm", reuters_sgml(made[:half])),
            write(folder / "reut2-001.sgm", reuters_sgml(made[half:]))]


def check_ci_page(name: str, page: Any, out: Path) -> None:
    """What every ci-scale results page must hold: claims that all hold, a README naming its command, scale and
    time, a results.json of finished runs with finite perplexities, drawn figures, no staging folder left.
    (tests/test_reproduce.py runs it on pages from scratch; tests/test_reproduce_starts.py on the CoNLL pages
    with a second start, whose from-scratch rows and claims are the from-scratch page's.)"""
    import json
    import math

    assert page.verdicts, "a page without claims checks nothing"
    failed = [f"{v.statement}: {v.ours}" for v in page.verdicts if not v.holds]
    assert not failed, f"{name} at the ci scale: claims that do not hold: {failed}"
    files = {p.name for p in out.iterdir()}
    assert {"README.md", "results.json"} <= files and any(f.endswith(".png") for f in files)
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "uedp reproduce " + name in text and "ci scale" in text and "minutes" in text
    assert "## The seeds' claims, checked" in text
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert data["runs"] and all(run["run_id"] for run in data["runs"])
    assert all(math.isfinite(run["perplexity"]) for run in data["runs"])
    for png in out.glob("*.png"):
        assert png.stat().st_size > 10_000  # a drawn figure, not an empty canvas
    assert not list(out.parent.glob(".page.tmp-*")) and not list(out.parent.glob(".page.old-*"))


TINY_MEMBER = "tiny_llama_pkg/TinyLlama.F32.gguf"


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k layout (its converter's permute), which transformers undoes on loading."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_tiny_gguf(path: Path) -> tuple[torch.nn.Module, Any]:
    """A tiny random Llama and a byte-level BPE vocabulary written as one GGUF file; returns both originals."""
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    from uedp.flows.demo import DEMO_CORPUS
    from uedp.models.tokenization import train_bpe_tokenizer

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


def tiny_packaged_base(folder: Path) -> tuple[Path, Any, torch.nn.Module, Any]:
    """A wheel-shaped zip in ``folder`` holding a tiny GGUF (:func:`write_tiny_gguf`), and the packaged base
    that pins it by both hashes (name "tiny"); with the original model and tokenizer."""
    import hashlib
    import zipfile

    from uedp.services.packaged_bases import PackagedBase

    gguf_file = folder / "TinyLlama.F32.gguf"
    model, tokenizer = write_tiny_gguf(gguf_file)
    wheel = folder / "tiny_llama_pkg-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf_file, TINY_MEMBER)
        archive.writestr("tiny_llama_pkg/__init__.py", "")
    base = PackagedBase(name="tiny", model="TinyLlama", package="tiny-llama-pkg", version="0.0.1",
                        wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), member=TINY_MEMBER,
                        member_sha256=hashlib.sha256(gguf_file.read_bytes()).hexdigest(), license="Apache-2.0",
                        trained_on="random weights written by the test")
    return wheel, base, model, tokenizer


def move_by_one_added_user(params: Any, max_len: int = 0) -> float:
    """How far adding one user (first, with a very different text) moves a user-level mechanism's clipped sum,
    with a secure root and each user's own stream, as a run draws them: a shared stream would reorder every other
    user's batches, and the move would exceed the clip."""
    from torch.nn.utils import parameters_to_vector

    from uedp.models.metrics import causal_lm_loss
    from uedp.privacy.mechanisms.userdp import UserDp
    from uedp.privacy.population import Population
    from uedp.privacy.randomness import Randomness

    data = fedavg_data(users=5, per_user=6)
    ids = list(data.by_user)
    extra_user = encode(TOKENIZER, ["an extra user with a very different text: +44 7700 900123"] * 6, 48)
    theta = parameters_to_vector(tiny_gpt2().parameters()).detach().clone()
    mechanism, root = UserDp(params, Population.declared(5), Randomness.secure()), Randomness.secure()

    def summed(users: list[Any], names: list[str]) -> torch.Tensor:
        trainer = mechanism.local_trainer(tiny_gpt2(), causal_lm_loss, torch.device("cpu"), data.pad_id, max_len)
        return trainer.clipped_sum(theta, users, [1.0] * len(users),
                                   [root.stream("local-batches", 1, name) for name in names])

    return float(torch.linalg.vector_norm(summed([extra_user, *data.by_user.values()], ["u-new", *ids])
                                          - summed(list(data.by_user.values()), ids)))


def run_id_printed(result: Any) -> str:
    """The MLflow run id a successful `uedp train` printed (CliRunner's result)."""
    import re

    assert result.exit_code == 0, result.output
    found = re.search(r"MLflow run: ([0-9a-f]{32})", result.output)
    assert found, result.output
    return found.group(1)
