"""The claims the pages from a pretrained start judge (the SmolLM2 rows of uedp-conll, selective-conll and
selective-wikitext), checked on figures made up to sit on each side of each claim: a claim holds where its
figures say it should, does not where they say otherwise, and a missing configuration is "not measured"
rather than a verdict. The ci pages (tests/test_reproduce*.py) check the same claims end to end, on figures a
tiny model happens to produce; these tests pin each threshold and each comparison's direction."""

from __future__ import annotations

import math

import pytest

from uedp.experiments import selective_conll, selective_wikitext, uedp_conll
from uedp.experiments.claims import MEASURABLE_EXPOSURE, Claim, judge
from uedp.experiments.common import Results, RunRow
from uedp.experiments.starts import Start

START = Start("packaged", "llama from smollm2", {}, uniform=49_152.0, public="SmolLM2's pretraining text",
              before=100.0, name="smollm2")
FAMILY = START.family


def row(label: str, perplexity: float, target: float | None = None, epsilon: float | None = None,
        **extra: float) -> RunRow:
    accounted = epsilon if epsilon is not None else (target if target is not None else math.inf)
    return RunRow(label, FAMILY, target, accounted, perplexity, 60.0, f"{label}{target}".ljust(32, "0"), dict(extra))


def verdict(claims: list[Claim], words: str, runs: list[RunRow], scale: str = "cpu") -> tuple[bool, str]:
    """The verdict of the one claim whose statement holds ``words``, judged on ``runs``."""
    (chosen,) = [c for c in claims if words in c.statement]
    (judged,) = judge([chosen], Results(runs), scale)  # type: ignore[arg-type]
    return judged.holds, judged.ours


# --- selective-wikitext, from a start ------------------------------------------------------------------------

WIKI = selective_wikitext.start_claims(START)


def wiki_rows(noiseless: float = 40.0, dpsgd: float = 44.0, selective: float = 43.0, deid: float = 36.0) -> list[RunRow]:
    return [row("noiseless", noiseless), row("deid", deid), row("dpsgd", dpsgd, 4.9), row("selective", selective, 4.9)]


def test_wikitext_near_noiseless_holds_at_the_threshold_and_not_past_it() -> None:
    limit = selective_wikitext.NEAR_NOISELESS
    assert verdict(WIKI, "within", wiki_rows(dpsgd=40.0 * limit, selective=41.0))[0]
    holds, ours = verdict(WIKI, "within", wiki_rows(dpsgd=40.0 * limit * 1.01, selective=41.0))
    assert not holds and "dpsgd 1.16x" in ours and "selective 1.02x" in ours
    assert not verdict(WIKI, "within", wiki_rows(dpsgd=41.0, selective=40.0 * limit * 1.01))[0]


def test_wikitext_private_models_must_each_beat_the_start() -> None:
    assert verdict(WIKI, "better than the pretrained start", wiki_rows())[0]
    holds, ours = verdict(WIKI, "better than the pretrained start", wiki_rows(dpsgd=START.before))
    assert not holds and "before fine-tuning 100" in ours  # equal to the start is no improvement
    assert not verdict(WIKI, "better than the pretrained start", wiki_rows(selective=150.0))[0]


def test_wikitext_selective_against_dpsgd_in_both_directions() -> None:
    assert verdict(WIKI, "beats dpsgd", wiki_rows(dpsgd=44.0, selective=43.0))[0]
    assert not verdict(WIKI, "beats dpsgd", wiki_rows(dpsgd=43.0, selective=44.0))[0]
    assert not verdict(WIKI, "beats dpsgd", wiki_rows(dpsgd=43.0, selective=43.0))[0]


def test_a_missing_configuration_is_not_measured_rather_than_judged() -> None:
    runs = [r for r in wiki_rows() if r.label != "dpsgd"]
    for words in ("beats dpsgd", "within", "better than the pretrained start"):
        holds, ours = verdict(WIKI, words, runs)
        assert not holds and ours.startswith("not measured (no finished run of dpsgd")


def test_the_start_claims_that_need_a_full_page_are_not_judged_at_the_ci_scale() -> None:
    judged = judge(WIKI, Results(wiki_rows()), "ci")
    assert [v.statement for v in judged] == [WIKI[0].statement]  # the ordering only: ci's tiny runs cannot reach targets


# --- selective-wikitext, the LSTM's claims ---------------------------------------------------------------------

LSTM = selective_wikitext.claims(selective_wikitext.SCALES["cpu"])


def lstm_rows(marked: dict[str, float], missed: dict[str, float], epsilon: float = 4.9) -> list[RunRow]:
    perplexities = {"noiseless": 150.0, "deid": 380.0, "dpsgd": 220.0, "selective": 286.0}
    return [row(m, p, None if m in ("noiseless", "deid") else 4.9,
                epsilon=None if m in ("noiseless", "deid") else epsilon,
                marked_canary_exposure=marked.get(m, 1.0), canary_exposure_mean=missed.get(m, 1.0))
            for m, p in perplexities.items()]


def test_the_lstm_order_is_the_papers_or_it_does_not_hold() -> None:
    runs = lstm_rows({}, {})
    holds, ours = verdict(LSTM, "orders noiseless < selective < dpsgd", runs)
    assert not holds and "noiseless 150 < selective 286 < dpsgd 220" in ours  # this page's figures: selective is worse
    assert verdict(LSTM, "selective beats dpsgd", runs)[0] is False
    swapped = [r if r.label not in ("dpsgd", "selective") else
               RunRow(r.label, r.family, r.target, r.epsilon, 300.0 if r.label == "dpsgd" else 200.0, r.seconds,
                      r.run_id, r.extra) for r in runs]
    assert verdict(LSTM, "orders noiseless < selective < dpsgd", swapped)[0]


def test_equal_epsilon_is_within_five_percent_of_the_target() -> None:
    target = selective_wikitext.SCALES["cpu"].epsilon
    assert verdict(LSTM, "same accounted epsilon", lstm_rows({}, {}, epsilon=target * 1.04))[0]
    assert not verdict(LSTM, "same accounted epsilon", lstm_rows({}, {}, epsilon=target * 1.06))[0]


def test_exposure_claims_are_judged_only_where_the_attack_finds_the_noiseless_canary() -> None:
    unmeasurable = lstm_rows({"noiseless": MEASURABLE_EXPOSURE - 0.5}, {"noiseless": MEASURABLE_EXPOSURE - 0.5})
    for words in ("is exposed less by dpsgd", "are exposed more by selective", "less than deid"):
        holds, ours = verdict(LSTM, words, unmeasurable)
        assert not holds and "not measurable at this scale" in ours
    found = lstm_rows({"noiseless": 12.0, "dpsgd": 2.0, "selective": 2.5},
                      {"noiseless": 9.0, "dpsgd": 1.5, "selective": 6.0, "deid": 8.0})
    assert verdict(LSTM, "is exposed less by dpsgd", found)[0]
    assert verdict(LSTM, "are exposed more by selective", found)[0]
    assert verdict(LSTM, "less than deid", found)[0]
    within_chance = lstm_rows({"noiseless": 12.0, "dpsgd": 11.5, "selective": 2.5},
                              {"noiseless": 9.0, "dpsgd": 5.5, "selective": 6.0, "deid": 8.0})
    assert not verdict(LSTM, "is exposed less by dpsgd", within_chance)[0]  # 0.5 bits apart: a rank moves that much
    assert not verdict(LSTM, "are exposed more by selective", within_chance)[0]


# --- selective-conll, from a start -------------------------------------------------------------------------

CONLL_SELECTIVE = selective_conll.start_claims(selective_conll.FROM_START["cpu"], START)


def selective_rows(noiseless: float, deid: float, dpsgd: float, selective: float, exposures: dict[str, float]) -> list[RunRow]:
    return [row(m, p, None if m in ("noiseless", "deid") else 8.0, canary_exposure_mean=exposures.get(m, 1.0))
            for m, p in (("noiseless", noiseless), ("deid", deid), ("dpsgd", dpsgd), ("selective", selective))]


def test_selective_conll_targets_from_a_start() -> None:
    good = selective_rows(30.0, 33.0, 34.0, 32.0, {"noiseless": 10.0, "dpsgd": 2.0})
    for words in ("two-phase selective beats dpsgd", "improves on the redacted model", "within 15%",
                  "better than the pretrained start", "hides the planted secrets"):
        assert verdict(CONLL_SELECTIVE, words, good)[0], words
    far = selective_rows(30.0, 33.0, 30.0 * 1.16, 32.0, {"noiseless": 10.0, "dpsgd": 2.0})
    holds, ours = verdict(CONLL_SELECTIVE, "within 15%", far)
    assert not holds and "dpsgd 1.16x" in ours
    worse_than_redacted = selective_rows(30.0, 31.0, 34.0, 32.0, {"noiseless": 10.0, "dpsgd": 2.0})
    assert not verdict(CONLL_SELECTIVE, "improves on the redacted model", worse_than_redacted)[0]


# --- uedp-conll, from a start ------------------------------------------------------------------------------

UEDP = uedp_conll.claims(uedp_conll.FROM_START["cpu"], START)
K = uedp_conll.FROM_START["cpu"].holders


def uedp_rows(before_start: float = 90.0, noiseless: float = 30.0) -> list[RunRow]:
    runs = [row("noiseless", noiseless), row("deid", noiseless + 4)]
    for target in (2.0, 8.0):
        runs += [row("userdp", before_start - 10 + target, target), row("uedp", before_start - 5 + target, target),
                 row(f"uedp-bounded-k{K}", before_start - 20 + target, target)]
    return runs


def test_uedp_conll_every_private_model_must_beat_the_start() -> None:
    holds, ours = verdict(UEDP, "every private model is better", uedp_rows())
    assert holds and "all 6 private models better" in ours
    holds, ours = verdict(UEDP, "every private model is better", uedp_rows(before_start=97.0))
    assert not holds and "not better: uedp at 8" in ours  # 97 - 5 + 8 = 100: not below the start's 100


def test_uedp_conll_orderings_from_a_start() -> None:
    runs = uedp_rows()
    assert verdict(UEDP, "noiseless has the lowest", runs)[0]
    assert not verdict(UEDP, "noiseless has the lowest", uedp_rows(noiseless=200.0))[0]
    assert verdict(UEDP, "deid is worse than noiseless", runs)[0]
    holds, ours = verdict(UEDP, "uedp is worse than userdp", runs)
    assert holds and "epsilon 2:" in ours and "epsilon 8:" in ours
    assert verdict(UEDP, f"uedp-bounded (k = {K})", runs)[0]


@pytest.mark.parametrize("claims", [WIKI, CONLL_SELECTIVE, UEDP], ids=["wikitext", "selective-conll", "uedp-conll"])
def test_every_start_claim_says_what_the_seed_paper_says_and_how_it_reads_when_it_holds(claims: list[Claim]) -> None:
    for claim in claims:
        assert claim.statement and claim.seeds and claim.when_holds in ("reproduces", "contradicts", "extends")
