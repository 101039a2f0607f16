"""GPT-2 language models: pretrained through ``from_pretrained`` (local path or hub name) or built
from a named size preset for small runs, demos and tests."""

from __future__ import annotations

from pathlib import Path

from transformers import GPT2Config, GPT2LMHeadModel

from uedp.errors import UedpError
from uedp.models.presets import PRESETS


def build_gpt2(preset: str, vocab_size: int, eos_token_id: int) -> GPT2LMHeadModel:
    """A freshly initialised GPT-2 of a preset size (weights from torch's seeded generator)."""
    if preset not in PRESETS:
        raise UedpError(f"unknown model preset {preset!r}; valid: {', '.join(PRESETS)}")
    config = GPT2Config(
        vocab_size=vocab_size,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **PRESETS[preset],
    )
    return GPT2LMHeadModel(config)


def load_gpt2(name_or_path: str | Path) -> GPT2LMHeadModel:
    """Load pretrained GPT-2 weights from a local folder (``save_pretrained``) or a hub name."""
    try:
        return GPT2LMHeadModel.from_pretrained(str(name_or_path))
    except OSError as exc:
        raise UedpError(
            f"cannot load GPT-2 weights from {name_or_path!r}: {str(exc).splitlines()[0]} "
            "(download them once with `huggingface-cli download gpt2 --local-dir <dir>` and pass that dir)"
        ) from None
