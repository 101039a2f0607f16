"""Tokenizers that cannot leak training text through their vocabulary.

A BPE vocabulary learned on private text memorises its frequent strings (a patient's surname can
become one token). uedp therefore uses either a pretrained tokenizer loaded as users load one
(``from_pretrained`` on a local path or hub name, e.g. GPT-2's byte-level BPE), or, for models built
from scratch, a pure byte-level tokenizer: 256 byte symbols and no merges, learned from nothing.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

EOS = "<|endoftext|>"


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A GPT-2-compatible byte-level tokenizer with no learned merges (vocabulary: 256 bytes + EOS)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    vocab[EOS] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers leaves this __init__ unannotated
        tokenizer_object=core, eos_token=EOS, pad_token=EOS, bos_token=EOS
    )


def load_tokenizer(name_or_path: str | Path) -> PreTrainedTokenizerBase:
    """Load a tokenizer the way users do; ``byte`` builds the leak-free byte-level one."""
    if str(name_or_path) == "byte":
        return byte_level_tokenizer()
    tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
