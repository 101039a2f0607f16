"""Model size presets and kinds: plain data, so configurations and the CLI can name and validate models
without importing torch or transformers."""

from __future__ import annotations

from typing import Literal, TypedDict

# gpt2 / llama: a from-scratch preset (or, for gpt2, a GPT-2 folder); lstm: the Selective-DP paper's LSTM;
# lstm-classifier: that LSTM with a head over classes (the UeDP paper's AG News classifier);
# bert: a classifier preset or encoder folder; causal-lm / classifier: any Hugging Face checkpoint folder of an
# ``AutoModelForCausalLM`` / ``AutoModelForSequenceClassification`` architecture, with its own tokenizer.
ModelKind = Literal["gpt2", "llama", "lstm", "lstm-classifier", "bert", "causal-lm", "classifier"]
Task = Literal["lm", "classification"]
# The size presets of every model kind (SIZE_PRESETS says which kind has which): a choice list in forms.
SizePreset = Literal["tiny", "small", "base", "large", "paper"]
# Where training runs: a choice list in forms (resolve_device checks that the machine has it).
# The training forward pass' precision (models.device.training_precision).
Precision = Literal["auto", "float32", "bf16"]
Device = Literal["auto", "cpu", "cuda", "cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:4", "cuda:5", "cuda:6",
                 "cuda:7"]


class Gpt2Preset(TypedDict):
    n_layer: int
    n_head: int
    n_embd: int
    n_positions: int


# Presets small enough for CPU demos and tests; "gpt2" itself is loaded with from_pretrained.
PRESETS: dict[str, Gpt2Preset] = {
    "tiny": {"n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 128},
    "small": {"n_layer": 4, "n_head": 4, "n_embd": 128, "n_positions": 256},
    # `uedp pretrain`'s public bases. base: the largest that pretrains in about an hour on 2 CPU cores (13.9M
    # parameters with an 8192-token vocabulary, 0.95 s per step of 32 x 48 tokens: benchmarks/pretrain_sizes.py;
    # 2,000 steps took 88 minutes in uedp's loop); large: GPT-2 117M's shape, for a GPU.
    "base": {"n_layer": 6, "n_head": 6, "n_embd": 384, "n_positions": 256},
    "large": {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024},
}


class LlamaPreset(TypedDict):
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int


# A modern decoder (RMSNorm, rotary positions, SwiGLU, grouped-query attention, no biases) small enough for
# CPU runs and tests; real Llama-family weights are passed as a folder (--model FOLDER).
LLAMA_PRESETS: dict[str, LlamaPreset] = {
    "tiny": {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 128},
    "small": {"hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 256},
    "base": {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 6,
             "num_key_value_heads": 3, "max_position_embeddings": 256},
    "large": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
              "num_key_value_heads": 4, "max_position_embeddings": 1024},
}


class LstmPreset(TypedDict):
    embedding_size: int
    hidden_size: int


# "paper" is the Selective-DP paper's model; "tiny" is for CPU tests and demos.
LSTM_PRESETS: dict[str, LstmPreset] = {
    "paper": {"embedding_size": 200, "hidden_size": 200},
    "tiny": {"embedding_size": 48, "hidden_size": 64},
}


class BertPreset(TypedDict):
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int


BERT_PRESETS: dict[str, BertPreset] = {
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
             "max_position_embeddings": 128},
    "small": {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 512,
              "max_position_embeddings": 256},
}


SIZE_PRESETS: dict[str, tuple[str, ...]] = {"gpt2": tuple(PRESETS), "llama": tuple(LLAMA_PRESETS),
                                            "lstm": tuple(LSTM_PRESETS), "lstm-classifier": tuple(LSTM_PRESETS),
                                            "bert": tuple(BERT_PRESETS),
                                            "causal-lm": (), "classifier": ()}

# Kinds that are only ever a checkpoint folder, trained with the folder's own tokenizer.
CHECKPOINT_KINDS: tuple[str, ...] = ("causal-lm", "classifier")
# Kinds whose models LoRA can adapt (Hugging Face transformers; not the LSTM).
LORA_KINDS: tuple[str, ...] = ("gpt2", "llama", "bert", "causal-lm", "classifier")


def task_of(kind: ModelKind) -> Task:
    return "classification" if kind in ("bert", "lstm-classifier", "classifier") else "lm"
