"""Decoder language models beyond GPT-2: any ``AutoModelForCausalLM`` checkpoint folder (Llama, Qwen2,
Mistral, Gemma, SmolLM, ...), loaded as users load one, and a Llama-style model built from a size preset
so CPU runs and tests cover a modern architecture (RMSNorm, rotary positions, grouped-query attention)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from uedp.errors import UedpError
from uedp.models.gpt2 import refuse_missing_weights
from uedp.models.presets import LLAMA_PRESETS

# Class-name endings of Hugging Face's decoder language models (LlamaForCausalLM, GPT2LMHeadModel).
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def build_llama(preset: str, vocab_size: int, eos_token_id: int) -> LlamaForCausalLM:
    """A freshly initialised Llama-style model of a preset size (weights from torch's seeded generator)."""
    if preset not in LLAMA_PRESETS:
        raise UedpError(f"unknown llama preset {preset!r}; valid: {', '.join(LLAMA_PRESETS)} (or pass a folder)")
    # No pad_token_id: Llama would make it the embedding's padding_idx, a row that never trains, and here it
    # is EOS (batches mark padding with label -100 and the attention mask instead).
    config = LlamaConfig(vocab_size=vocab_size, bos_token_id=eos_token_id, eos_token_id=eos_token_id,
                         pad_token_id=None, attention_dropout=0.0, tie_word_embeddings=False,
                         **LLAMA_PRESETS[preset])
    return LlamaForCausalLM(config)


def load_causal_lm(path: str | Path) -> PreTrainedModel:
    """Any causal-LM checkpoint folder, in float32 (training and clipping work in float32; a bf16 checkpoint
    is upcast). A folder of another kind of model (an encoder, a classifier) or missing weights is refused:
    ``from_pretrained`` would start the missing ones from random values and only its load report would say so."""
    held = str(path)
    try:
        config = AutoConfig.from_pretrained(str(path))
        held = ", ".join(getattr(config, "architectures", None) or []) or config.model_type
        if config.architectures and not any(a.endswith(CAUSAL_SUFFIXES) for a in config.architectures):
            # an encoder's masked LM loads as a causal LM too, and would train seeing the tokens it predicts
            raise UedpError(f"{path} holds a {held} checkpoint, not a causal language model (an architecture "
                            f"ending in {' or '.join(CAUSAL_SUFFIXES)}); for an encoder, train a classifier with "
                            f"--model bert --model-config {path}")
        loaded: tuple[PreTrainedModel, dict[str, Any]] = AutoModelForCausalLM.from_pretrained(  # type: ignore[assignment]
            str(path), dtype=torch.float32, output_loading_info=True)
    except ValueError as exc:  # transformers: "Unrecognized configuration class ... for this kind of AutoModel"
        raise UedpError(f"{path} holds a {held} checkpoint, not a causal language model: "
                        f"{str(exc).splitlines()[0]}") from None
    except OSError as exc:
        raise UedpError(f"cannot load a causal LM from {path}: {str(exc).splitlines()[0]} (download one once with "
                        "`huggingface-cli download <name> --local-dir <dir>` and pass that dir)") from None
    model, info = loaded
    refuse_missing_weights(path, info["missing_keys"])
    return model
