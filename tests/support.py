"""Helpers the tests share: plain functions and constants (fixtures live in conftest.py). Nothing here is a
test; test files import from here, never from each other."""

from __future__ import annotations

from pathlib import Path

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
