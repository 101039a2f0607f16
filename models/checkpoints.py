"""Checkpoint folders as users download them (``config.json``, weights, tokenizer files): what kind of model
a folder holds, and its identity (a content hash), read with nothing heavier than ``json`` and ``hashlib``,
so configurations can resolve ``--model FOLDER`` without importing torch or transformers."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from uedp.errors import UedpError

CONFIG_FILE = "config.json"
# In every model a run logs, and beside it as ``--init-from`` downloads it: the run, its dataset and every text its
# weights saw (services.lineage). Not part of the folder's identity: the same weights are the same checkpoint.
INIT_RUN_FILE = "init_run.json"
# Beside a finished run's model as ``--init-from`` downloads it: the run's logged configuration.
RESOLVED_CONFIG = "resolved_config.json"
# What a folder's identity covers: the weights and the files that decide how they are used, by name and at
# the top level only. Anything else a user keeps beside them (their own data, notes) is never hashed: the
# hash is released, and a hash of private bytes would let anyone test guesses of them.
_IDENTITY_NAMES = frozenset({"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                             "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
                             "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "chat_template.jinja",
                             "adapter_config.json", "base.json"})
_IDENTITY_SUFFIXES = (".safetensors", ".bin", ".tiktoken", ".safetensors.index.json", ".bin.index.json")


def is_checkpoint_folder(path: str | Path) -> bool:
    return bool(str(path)) and (Path(path).expanduser() / CONFIG_FILE).is_file()


def is_run_download(path: str | Path) -> bool:
    """A run's model as ``--init-from RUN`` downloads it: with the run's marker and configuration beside it."""
    folder = Path(path).expanduser()
    return (folder / INIT_RUN_FILE).is_file() and (folder / RESOLVED_CONFIG).is_file()


def has_tokenizer(path: str | Path) -> bool:
    """Whether a folder ships its own tokenizer (a fast tokenizer file or a tokenizer config)."""
    folder = Path(path).expanduser()
    return (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()


def checkpoint_kind(path: str | Path) -> str:
    """``classifier`` for a folder whose architecture is a sequence classifier, else ``causal-lm``."""
    config_file = Path(path).expanduser() / CONFIG_FILE
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UedpError(f"{path}: not a model kind (gpt2, llama, lstm, bert) nor a checkpoint folder "
                        f"(no {CONFIG_FILE}); download one with `huggingface-cli download <name> --local-dir "
                        "<dir>` and pass that dir") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UedpError(f"{config_file}: cannot read it as JSON ({exc})") from None
    architectures = config.get("architectures") or []
    return "classifier" if any(str(a).endswith("ForSequenceClassification") for a in architectures) else "causal-lm"


def is_identity_file(name: str) -> bool:
    return name in _IDENTITY_NAMES or name.endswith(_IDENTITY_SUFFIXES)


# The files that hold a tokenizer's vocabulary (its merges or word list), whichever format saved it.
_VOCABULARY_NAMES = frozenset({"tokenizer.json", "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model",
                               "spiece.model", "sentencepiece.bpe.model"})


def vocabulary_file_hashes(path: str | Path) -> list[str]:
    """``vocabulary-sha256:`` of each vocabulary file in a folder, one by one: a copy of any of them into
    another folder (the tokenizer without the model) is still known by its bytes."""
    folder = Path(path)
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.iterdir() if p.is_file() and (p.name in _VOCABULARY_NAMES
                                                                   or p.name.endswith(".tiktoken")))
    return [f"vocabulary-sha256:{hashlib.sha256(p.read_bytes()).hexdigest()}" for p in files]


def content_hash(path: str | Path) -> str:
    """``sha256:`` of a checkpoint folder's model files (names and bytes, in name order; see
    :func:`is_identity_file`): the base model a LoRA adapter or an ``--init-from`` run names, so loading it
    later can check it is the same one."""
    folder = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in folder.iterdir() if p.is_file() and is_identity_file(p.name))
    if not files:
        raise UedpError(f"{folder}: no checkpoint files to identify")
    for file in files:
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return f"sha256:{digest.hexdigest()}"
