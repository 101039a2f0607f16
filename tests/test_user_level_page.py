"""The user-level learning page's configurations from a packaged start (``--start smollm2``): every run
loads the converted folder with LoRA adapters, a user-level row packs its users' text into chunks and says
so in its variant (the shared rows' key), and each row reports the share of noiseless fine-tuning's gain it
keeps. Pure functions: no run trains here (the page itself is hours of a 135M model)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from uedp.experiments.learning_results import ReutersBase
from uedp.experiments.user_level_learning import Corpus, Row, gain_kept, row_flags, rule_of, variant_label

SMOL = ReutersBase("/h/bases/smollm2", "/h/bases/smollm2", 64, "SmolLM2", {"eng.testb": 160.0}, name="smollm2",
                   lora_rank=8)
REUTERS = ReutersBase("/h/base/model", "/h/base/vocab", 96, "gpt2 small", {"eng.testb": 270.0})
CONLL = Corpus("conll", (Path("eng.train"), Path("eng.testa"), Path("eng.testb")), 946)


def _flag(flags: list[str], name: str) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else None


def test_a_packaged_start_loads_its_folder_with_lora_and_the_reuters_base_initialises_gpt2() -> None:
    assert SMOL.flags() == ["--model", "/h/bases/smollm2", "--max-len", "64", "--lora-rank", "8"]
    assert REUTERS.flags()[:4] == ["--model", "gpt2", "--model-size", "small"] and "--lora-rank" not in REUTERS.flags()


def test_user_level_rows_name_the_lora_rank_and_the_contribution_rule_in_their_variant() -> None:
    after = row_flags(Row("userdp", "after", 8.0, 0), CONLL, 1.0, [], SMOL, "chunks")
    assert _flag(after, "--variant") == "after-lora8-chunks" and _flag(after, "--user-text") == "chunks"
    assert _flag(after, "--local-update") == "gradient"
    dpsgd = row_flags(Row("dpsgd", "", 8.0, 0), CONLL, 1.0, [], SMOL, "chunks")
    assert "--user-text" not in dpsgd and "--variant" not in dpsgd  # example-level: no user's text to pack
    old = row_flags(Row("uedp-bounded", "before", 2.0, 1), CONLL, 1.0, [], REUTERS)
    assert _flag(old, "--variant") == "before" and "--user-text" not in old  # the Reuters page's names, unchanged
    for variant in ("after-lora8-chunks", "after", "before-chunks"):
        assert rule_of(variant) in ("after", "before")
    assert variant_label("after", SMOL) == "after-lora8" and variant_label("after", REUTERS, "chunks") == "after-chunks"


def test_the_gain_kept_is_measured_in_log_perplexity_from_the_start() -> None:
    assert gain_kept(160.0, 42.0, 42.0) == pytest.approx(1.0)
    assert gain_kept(160.0, 160.0, 42.0) == pytest.approx(0.0)
    assert gain_kept(160.0, math.sqrt(160.0 * 42.0), 42.0) == pytest.approx(0.5)  # halfway in log perplexity
    assert gain_kept(160.0, 200.0, 42.0) < 0  # worse than the start
    assert math.isnan(gain_kept(40.0, 50.0, 42.0))  # noiseless did not improve on the start: nothing to keep
