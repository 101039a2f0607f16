"""What each registered mechanism declares (``privacy/mechanisms/specs``), checked fact by fact.

Every caller reads a mechanism through its registry entry: the ledger composes releases by its privacy
unit, set-up opens the text it trains on and the inputs it needs, the planner reads its phases, a sweep
trains it once where categories change nothing, and the CLI refuses combinations before any work. A fact
changed by accident (a unit's adjacency, a text source) would change an epsilon's meaning silently, so
each one is stated here, and the rules that hold across all entries are checked for every entry.
"""

from __future__ import annotations

import pytest

from uedp.models.metrics import causal_lm_loss, classification_loss, per_sequence_lm_loss
from uedp.privacy.mechanisms import registry
from uedp.privacy.mechanisms.registry import AuditDesign, RunShape

GPT2, LSTM, LLAMA = RunShape("gpt2"), RunShape("lstm"), RunShape("llama")
LOCAL = {"epsilon": 2.0, "embeddings": "vectors.txt"}  # custext and santext need their release's settings


def _params(name: str, **settings: object):  # type: ignore[no-untyped-def]
    spec = registry.get(name)
    return spec.default_params(**(LOCAL if spec.guarantee == "local" else {}), **settings)


# name: (guarantee, text, (adjacency, kind), counts, per-example loss, needs on GPT-2, fewest users)
FACTS = {
    "noiseless": ("none", "original", ("none", "none"), None, False, set(), 1),
    "deid": ("none", "redacted", ("none", "none"), None, False, set(), 1),
    "dpsgd": ("central", "original", ("add/remove", "sequence"), "sequences", True, set(), 1),
    "selective": ("central", "original", ("replace-one", "sensitive-token-value"), None, True, {"redacted"}, 1),
    "userdp": ("central", "original", ("add/remove", "user"), "users", False, set(), 2),
    "uedp": ("central", "original", ("add/remove", "user+entity"), "anchored writers", False, {"entities"}, 2),
    "uedp-naive": ("central", "original", ("add/remove", "user+entity"), "anchored writers", False, {"entities"}, 2),
    "uedp-bounded": ("central", "original", ("substitution", "user+entity"), None, False, {"entities"}, 2),
    "custext": ("local", "sanitized", ("local", "token-value"), None, False, set(), 1),
    "santext": ("local", "sanitized", ("local", "token-value"), None, False, set(), 1),
}


def test_every_registered_mechanism_has_its_facts_stated_here() -> None:
    assert set(registry.names()) == set(FACTS)


@pytest.mark.parametrize("name", sorted(FACTS))
def test_each_mechanisms_declared_facts(name: str) -> None:
    spec = registry.get(name)
    guarantee, text, unit, counts, per_example, needs, fewest = FACTS[name]
    assert (spec.guarantee, spec.text, spec.counts, spec.per_example_loss) == (guarantee, text, counts, per_example)
    assert spec.privacy_unit is not None and (spec.privacy_unit.adjacency, spec.privacy_unit.kind) == unit
    assert spec.needs(GPT2) == needs and spec.min_train_users == fewest
    assert spec.private == (guarantee != "none")
    assert _params(name).mechanism == name


@pytest.mark.parametrize("name", sorted(FACTS))
def test_a_private_mechanisms_unit_words_are_its_parameters_and_its_statements(name: str) -> None:
    spec = registry.get(name)
    assert spec.unit and spec.summary and "\n" not in spec.summary
    if spec.private:
        assert spec.privacy_unit is not None and spec.privacy_unit.name and spec.privacy_unit.adjacency != "none"


def test_mechanisms_that_count_their_units_quote_an_epsilon_before_training() -> None:
    """``uedp epsilon`` and the planner quote every mechanism whose epsilon depends on a count of units."""
    for name in registry.names():
        spec = registry.get(name)
        if spec.counts is not None:
            assert spec.quote is not None, name


def test_one_unit_one_total_mechanisms_sharing_a_unit_share_its_key() -> None:
    assert registry.get("uedp").privacy_unit == registry.get("uedp-naive").privacy_unit
    assert registry.get("custext").privacy_unit == registry.get("santext").privacy_unit
    # uedp-bounded changes contents, not membership: its releases compose apart from uedp's
    assert registry.get("uedp-bounded").privacy_unit != registry.get("uedp").privacy_unit


def test_ranks_are_distinct_and_list_baselines_first() -> None:
    ranks = {name: registry.get(name).rank for name in registry.names()}
    assert len(set(ranks.values())) == len(ranks)
    assert list(registry.names()) == sorted(ranks, key=ranks.get)  # type: ignore[arg-type]
    assert registry.names()[:2] == ("noiseless", "deid")


def test_selectives_two_forms_need_different_inputs_and_phases() -> None:
    spec, params = registry.get("selective"), _params("selective", steps=5, public_steps=3)
    assert spec.needs(GPT2) == {"redacted"} and spec.needs(LSTM) == {"private_masks"}
    assert spec.schedule(params, GPT2) == (("public", 3), ("private", 5))
    assert spec.schedule(params, LSTM) == (("private", 5),)


@pytest.mark.parametrize(("name", "settings", "shape", "refusal"), [
    ("selective", {}, RunShape("lstm", processes=2), "recurrent selective \\(lstm\\) runs in one process"),
    ("selective", {}, RunShape("lstm", audit_canaries=8), "a canary's secret spans several tokens"),
    ("custext", {}, RunShape("gpt2", canaries=4), "canaries are planted in the training text after sanitization"),
    ("userdp", {"vectorize_users": True}, LLAMA, "vectorize_users is implemented for GPT-2"),
    ("uedp", {"user_text": "chunks"}, RunShape("gpt2", classification=True), "user_text=chunks packs"),
])
def test_combinations_a_mechanism_refuses_are_refused_before_training(name: str, settings: dict[str, object],
                                                                        shape: RunShape, refusal: str) -> None:
    spec = registry.get(name)
    with pytest.raises(ValueError, match=refusal):
        spec.check(_params(name, **settings), shape)


@pytest.mark.parametrize(("name", "settings", "shape"), [
    ("selective", {}, RunShape("gpt2", processes=2, audit_canaries=8)),
    ("userdp", {"vectorize_users": True}, GPT2),
    ("uedp-bounded", {"user_text": "chunks"}, GPT2),
    ("dpsgd", {}, RunShape("gpt2", processes=4, canaries=3)),
])
def test_the_combinations_they_support_pass(name: str, settings: dict[str, object], shape: RunShape) -> None:
    assert registry.get(name).check(_params(name, **settings), shape) is None  # no refusal raised


def test_categories_matter_only_where_they_change_what_is_trained() -> None:
    for name in ("noiseless", "dpsgd", "userdp"):
        assert not registry.get(name).uses_categories(_params(name)), name
    for name in ("deid", "selective", "uedp", "uedp-bounded"):
        assert registry.get(name).uses_categories(_params(name)), name
    custext = registry.get("custext")
    assert not custext.uses_categories(_params("custext"))
    assert custext.uses_categories(_params("custext", keep="non-entities"))


def test_the_loss_is_per_example_where_dp_sgd_clips_and_a_classifiers_otherwise() -> None:
    assert registry.get("dpsgd").loss(False) is per_sequence_lm_loss
    assert registry.get("selective").loss(False) is per_sequence_lm_loss
    assert registry.get("userdp").loss(False) is causal_lm_loss
    assert registry.get("dpsgd").loss(True) is classification_loss


def test_audit_designs_and_the_reason_where_there_is_none() -> None:
    designs = {name: registry.get(name).audit for name in registry.names()}
    assert all(isinstance(designs[n], AuditDesign) for n in FACTS if registry.get(n).guarantee != "local")
    assert all(isinstance(designs[n], str) and "not supported yet" in designs[n] for n in ("custext", "santext"))


def test_only_uedp_bounded_warns_about_the_data_before_training() -> None:
    assert [n for n in registry.names() if registry.get(n).data_warnings is not None] == ["uedp-bounded"]


def test_an_unknown_mechanism_is_named_with_the_registered_ones() -> None:
    with pytest.raises(Exception, match="nope") as raised:
        registry.get("nope")
    assert "dpsgd" in str(raised.value)
