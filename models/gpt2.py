"""GPT-2 language models: pretrained through ``from_pretrained`` (local path or hub name) or built
from a named size preset for small runs, demos and tests."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, GPT2Config, GPT2LMHeadModel

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
    """Load pretrained GPT-2 weights from a local folder (``save_pretrained``) or a hub name.

    A checkpoint of another architecture, or one missing weights, is refused: ``from_pretrained`` would
    load it as a GPT-2 whose missing weights are newly initialised, and only its load report would say so
    (a Llama folder trained as a random GPT-2 to perplexity 551 without an error)."""
    try:
        config = AutoConfig.from_pretrained(str(name_or_path))
        if config.model_type != "gpt2":
            held = ", ".join(config.architectures or []) or config.model_type
            raise UedpError(f"{name_or_path} holds a {config.model_type} checkpoint ({held}), not a GPT-2 one: "
                            "--model gpt2 would load it as a GPT-2 with every weight newly initialised")
        # output_loading_info makes from_pretrained return (model, {"missing_keys": ..., ...})
        loaded: tuple[GPT2LMHeadModel, dict[str, Any]] = GPT2LMHeadModel.from_pretrained(  # type: ignore[assignment]
            str(name_or_path), dtype=torch.float32, output_loading_info=True)
        model, info = loaded
    except (OSError, ValueError) as exc:
        raise UedpError(
            f"cannot load GPT-2 weights from {name_or_path!r}: {str(exc).splitlines()[0]} "
            "(download them once with `huggingface-cli download gpt2 --local-dir <dir>` and pass that dir)"
        ) from None
    refuse_missing_weights(name_or_path, info["missing_keys"])
    return model


def refuse_missing_weights(name_or_path: str | Path, missing: Iterable[str], fresh: tuple[str, ...] = ()) -> None:
    """A checkpoint must hold every weight of the model it loads into, except those that are meant to start
    fresh (``fresh``: name prefixes, e.g. a classifier's new head): the rest would start from random values."""
    absent = sorted(key for key in missing if not (fresh and key.startswith(fresh)))
    if absent:
        raise UedpError(f"{name_or_path}: {len(absent)} weight(s) the model needs are not in the checkpoint "
                        f"(e.g. {absent[0]}); they would start from random values")
