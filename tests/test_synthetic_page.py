"""The synthetic-text page's rows (``experiments/synthetic_conll.py``): from either start, each row is told
apart by mechanism, target, seed and whether it is the real-text yardstick, and every row of results.json
carries the shared keys (corpus, mechanism, target_epsilon, start, seed, perplexity_real_test). Pure functions
and a page written from made-up figures: no run trains here (the page itself is hours of a 135M model)."""

from __future__ import annotations

import json
from pathlib import Path

from uedp.experiments.learning_results import ReutersBase
from uedp.experiments.synthetic_conll import (
    REAL,
    REAL_VARIANT,
    USER_LEVEL,
    Row,
    matches,
    page_row,
    plan_rows,
    results_page,
    train_flags,
)

SHARED = {"corpus", "mechanism", "target_epsilon", "start", "seed", "perplexity_real_test"}
SMOL = ReutersBase("/h/bases/smollm2", "/h/bases/smollm2", 64, "SmolLM2-135M, LoRA adapters of rank 8",
                   {"eng.testb": 160.0}, name="smollm2", lora_rank=8)


def _flag(flags: list[str], name: str) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else None


def test_rows_run_seed_by_seed_yardsticks_first_then_the_largest_epsilon() -> None:
    rows = plan_rows([REAL, "noiseless", "dpsgd", "userdp"], [3.0, 8.0], [0, 1])
    assert [(r.mechanism, r.target, r.seed) for r in rows[:6]] == [
        (REAL, None, 0), ("noiseless", None, 0), ("userdp", 8.0, 0), ("dpsgd", 8.0, 0), ("userdp", 3.0, 0),
        ("dpsgd", 3.0, 0)]
    # the real row once: the utility measure trains every corpus' model with seed 0, and it is trained so
    assert {r.seed for r in rows[6:]} == {1} and len(rows) == 11 and [r.mechanism for r in rows].count(REAL) == 1
    # seed 0 keeps the corpus names of the page made before seeds; another seed says its own
    assert Row("dpsgd", 8.0).name == "synth-dpsgd-e8" and Row("noiseless", None).name == "synth-noiseless"
    assert Row("dpsgd", 8.0, 1).name == "synth-dpsgd-e8-s1" and Row(REAL, None).name == REAL_VARIANT


def test_the_real_row_trains_as_the_utility_measure_does_and_is_never_taken_for_noiseless() -> None:
    real = train_flags(Row(REAL, None, 2), utility_steps=300)
    assert (_flag(real, "--mechanism"), _flag(real, "--steps"), _flag(real, "--batch-size")) == ("noiseless", "300", "16")
    assert _flag(real, "--variant") == REAL_VARIANT and _flag(real, "--seed") == "2"
    assert "--log-model" not in real  # nothing is generated from it
    userdp = train_flags(Row("userdp", 8.0), utility_steps=300)
    assert _flag(userdp, "--target-epsilon") == "8" and "--log-model" in userdp
    assert all(flag in userdp for flag in USER_LEVEL)
    noiseless_run = {"mechanism": "noiseless", "target_epsilon": "None", "variant": "", "seed": "0"}
    real_run = {**noiseless_run, "variant": REAL_VARIANT}
    assert matches(Row("noiseless", None), noiseless_run) and not matches(Row("noiseless", None), real_run)
    assert matches(Row(REAL, None), real_run) and not matches(Row(REAL, None), noiseless_run)
    assert not matches(Row("noiseless", None, 1), noiseless_run)  # another seed's run
    dpsgd_run = {"mechanism": "dpsgd", "target_epsilon": "8.0", "variant": "", "seed": "0"}
    assert matches(Row("dpsgd", 8.0), dpsgd_run) and not matches(Row("dpsgd", 3.0), dpsgd_run)


def _measured(perplexity: float) -> dict[str, object]:
    leakage = {"ngram_overlap": 0.01, "ngram_overlap_reference": 0.02, "copied_sentences": 0,
               "copied_sentences_reference": 9, "entity_surfaces": 200, "entity_surfaces_reference": 550,
               "dataset": "synth", "categories": ["PER"]}
    return {"utility": {"perplexity_real_test": perplexity, "run_id": "u" * 32, "steps": 300}, "leakage": leakage}


def test_results_carry_the_shared_keys_and_the_page_shows_the_real_yardstick(tmp_path: Path) -> None:
    real = page_row(Row(REAL, None), "smollm2", "r" * 32, {"perplexity_test": 45.0}, {"steps": "300"}, {})
    dpsgd = page_row(Row("dpsgd", 8.0), "smollm2", "d" * 32, {"perplexity_test": 60.0, "final_epsilon": 7.98},
                     {"privacy_unit": "one sentence: its tokens"}, _measured(90.0))
    for row in (real, dpsgd):
        assert set(row) >= SHARED and row["corpus"] == "conll" and row["start"] == "smollm2"
    assert real["perplexity_real_test"] == 45.0 and real["mechanism"] == REAL
    assert dpsgd["perplexity_real_test"] == 90.0 and dpsgd["synthetic_dataset"] == "synth-dpsgd-e8"
    assert "leakage_dataset" not in dpsgd and dpsgd["leakage_entity_surfaces"] == 200
    results_page(tmp_path, [real, dpsgd], SMOL, {"count": 1000, "prompt_words": 2, "utility_steps": 300})
    text = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "the start scores **160.0**" in text and "SmolLM2-135M" in text
    assert "| real train split (no corpus) | - | 0 | none | - | 45.0 | yes |" in text
    assert "| dpsgd | 8 | 0 | 7.98 (one sentence) | 60.0 | 90.0 | yes |" in text
    leakage = text.split("## Leakage")[1]
    assert "| dpsgd | 8 | 0 | 1.00% (2.00%) | 0 (9) | 200 (550) |" in leakage and "real" not in leakage.split("|---")[-1]
    saved = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert [r["mechanism"] for r in saved["rows"]] == [REAL, "dpsgd"] and saved["base"]["name"] == "smollm2"
    assert (tmp_path / "results.png").stat().st_size > 10_000


def _accuracy(corpus: float, real: float = 0.9, real_run: str = "c" * 32) -> dict[str, object]:
    measured = _measured(50.0)
    return {"accuracy": {"accuracy_real_test": corpus, "run_id": "k" * 32, "steps": 300, "real_run_id": real_run,
                         "real_accuracy_real_test": real}, "leakage": measured["leakage"]}


def test_labelled_rows_read_each_item_after_its_code_and_are_judged_against_the_noiseless_corpus(
        tmp_path: Path) -> None:
    from uedp.experiments.synthetic_agnews import labelled_flags, points_below, real_rows
    from uedp.experiments.synthetic_agnews import page_row as labelled_row
    from uedp.experiments.synthetic_agnews import results_page as labelled_page

    assert labelled_flags(Row("dpsgd", 8.0), 300)[-1] == "--control-codes"
    metrics = {"perplexity_test": 30.0, "final_epsilon": 8.0}
    rows = [labelled_row(Row("noiseless", None), "smollm2", "n" * 32, {"perplexity_test": 20.0}, {}, _accuracy(0.85)),
            labelled_row(Row("dpsgd", 8.0), "smollm2", "d" * 32, metrics, {"privacy_unit": "one training sequence"},
                         _accuracy(0.83)),
            labelled_row(Row("userdp", 8.0), "smollm2", "u" * 32, metrics, {"privacy_unit": "one user: all"},
                         _accuracy(0.70)),
            labelled_row(Row("userdp", 8.0, 1), "smollm2", "v" * 32, metrics, {"privacy_unit": "one user: all"},
                         _accuracy(0.70, real_run="e" * 32))]
    for row in rows:
        assert set(row) >= SHARED - {"perplexity_real_test"} | {"accuracy_real_test"} and row["corpus"] == "agnews"
    assert round(points_below(rows, rows[1]) or 0, 6) == 2.0 and round(points_below(rows, rows[2]) or 0, 6) == 15.0
    assert points_below(rows, rows[3]) is None  # seed 1 has no noiseless corpus measured
    real = real_rows(rows, "smollm2")  # one real-train classifier per run, whichever corpus measured it
    assert [(r["mechanism"], r["run_id"], r["accuracy_real_test"]) for r in real] == [
        (REAL, "c" * 32, 0.9), (REAL, "e" * 32, 0.9)]
    labelled_page(tmp_path, real + rows, SMOL, {"count": 2000, "utility_steps": 300, "items_per_user": 15})
    text = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "| dpsgd | 8 | 0 | 8 (one training sequence) | 83.0% | +2.0 | met (<= 3) |" in text
    assert "| userdp | 8 | 0 | 8 (one user) | 70.0% | +15.0 | missed (<= 6) |" in text
    assert "| real train split (no corpus) | - | 0 | none | 90.0% | - | - |" in text


def test_the_committed_page_re_renders_from_its_results_unchanged(tmp_path: Path) -> None:
    """docs/results/synthetic-conll is what today's code writes from its results.json (its runs' home is gone,
    so a change of the rows' keys or the tables must carry the committed page along)."""
    committed = Path(__file__).resolve().parents[1] / "docs" / "results" / "synthetic-conll"
    saved = json.loads((committed / "results.json").read_text(encoding="utf-8"))
    assert all(set(row) >= SHARED for row in saved["rows"])
    results_page(tmp_path, saved["rows"], ReutersBase(**saved["base"]), saved["settings"])
    assert (tmp_path / "results.md").read_text(encoding="utf-8") == (committed / "results.md").read_text(
        encoding="utf-8")
