"""A run's test figure in bits per byte (``models.metrics.predicted_bytes``, ``bits_per_byte``): the perplexity
it already computed, over the bytes of the text it scored, so models of different vocabularies compare on
the same text. Checked against the NLL summed directly, on a byte and a BPE vocabulary."""

from __future__ import annotations

import math

import pytest
import torch

from uedp.models.batching import encode
from uedp.models.metrics import bits_per_byte, causal_lm_nll, perplexity, predicted_bytes, predicted_tokens
from uedp.models.tokenization import byte_level_tokenizer, train_bpe_tokenizer, word_level_tokenizer

TEXTS = ["Peter Blackburn said on Monday .", "Été à Genève , 1996 .", "EU rejects German call to boycott British lamb ."]


def _model(vocab: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=128, n_embd=16, n_layer=1, n_head=2)).eval()


def test_on_a_byte_vocabulary_a_token_is_a_byte_and_a_texts_end_one_more() -> None:
    tokenizer = byte_level_tokenizer()
    sequences = encode(tokenizer, TEXTS, 128)
    # every byte after each text's first, and its EOS
    assert predicted_bytes(tokenizer, sequences) == sum(len(t.encode("utf-8")) for t in TEXTS) - len(TEXTS) + len(TEXTS)
    assert predicted_bytes(tokenizer, sequences) == predicted_tokens(sequences)
    assert bits_per_byte(8.0, 60, 60) == pytest.approx(3.0)


def test_on_a_bpe_vocabulary_it_is_the_summed_nll_in_bits_over_the_bytes_scored() -> None:
    tokenizer = train_bpe_tokenizer([t for t in TEXTS for _ in range(20)], 300)
    sequences = encode(tokenizer, TEXTS, 128)
    n_bytes = predicted_bytes(tokenizer, sequences)
    # the bytes of each text but its first token's, and one for its end
    firsts = [tokenizer.decode([int(sequence[0])]) for sequence in sequences]
    assert all(text.startswith(first) for text, first in zip(TEXTS, firsts))  # none of these splits a character
    assert n_bytes == sum(len(t.encode("utf-8")) - len(f.encode("utf-8")) + 1 for t, f in zip(TEXTS, firsts))
    assert n_bytes > predicted_tokens(sequences)  # a BPE token spells several bytes
    model = _model(len(tokenizer))
    value = perplexity(model, sequences, tokenizer.pad_token_id, torch.device("cpu"))
    total = 0.0
    for sequence in sequences:  # the NLL, one text at a time, with no padding at all
        ids = sequence.unsqueeze(0)
        with torch.no_grad():
            nll, _ = causal_lm_nll(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
        total += float(nll)
    assert bits_per_byte(value, predicted_tokens(sequences), n_bytes) == pytest.approx(
        total / math.log(2) / n_bytes, rel=1e-5)


def test_no_figure_where_the_text_cannot_be_spelt_back() -> None:
    words = word_level_tokenizer(["Peter", "said", "."])
    assert predicted_bytes(words, encode(words, TEXTS, 128)) is None  # <unk> would count made-up bytes
    assert bits_per_byte(10.0, 5, None) is None and bits_per_byte(10.0, 5, 0) is None
    assert bits_per_byte(math.inf, 5, 5) is None  # a diverged model has no per-byte figure either
