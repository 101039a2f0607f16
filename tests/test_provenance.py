"""Where a run's text comes from decides four things in one place (services/provenance.py): whether the
configuration may train on it, whether the run is charged, the plan's unit and epsilon, and how the statement
reads. Each kind of text answers them as docs/PRIVACY.md says; the end-to-end tests (ledger, releases,
synthetic text, public datasets) exercise the same object through `uedp train`."""

from __future__ import annotations

import math

import pytest

from uedp.errors import UedpError
from uedp.flows.demo import DEMO_CORPUS
from uedp.privacy.mechanisms import registry
from uedp.privacy.population import Population
from uedp.privacy.statement import PrivacyStatement
from uedp.services.config import TrainConfig
from uedp.services.provenance import Provenance
from uedp.services.releases import SanitizeResult
from uedp.services.synthetic_source import SyntheticSource
from uedp.services.training import reservation
from uedp.services.training_plan import PublicFacts, plan_training
from uedp.storage.ingest import IngestOptions, ingest
from uedp.storage.public_declaration import write_declaration

GENERATING = PrivacyStatement("userdp", "one user (all of their sentences)", epsilon=3.0, delta=1e-5,
                              accountant="pld", randomness="secure")
SYNTHETIC = SyntheticSource("a" * 32, "private", "userdp", GENERATING)
RELEASE = SanitizeResult(per_token_epsilon=2.0, record_epsilon_max=20.0, record_epsilon_median=8.0,
                         user_epsilon_max=60.0, tokens=1000, sanitized_share=0.5, unchanged_share=0.6,
                         sanitized_unchanged_share=0.2, unknown_share=0.0, dataset="demo-custext", reused=True,
                         unprotected_share=0.1, statement="custext: epsilon 2 per token")


def _plan(config: TrainConfig):  # type: ignore[no-untyped-def]
    return plan_training(config, PublicFacts(Population.declared(40), n_examples=500, train_users=40))


def test_each_kind_of_text_answers_whether_the_run_is_charged() -> None:
    assert Provenance("demo").charged
    assert not Provenance("demo", declared_public=True).charged  # no one in it to protect
    assert not Provenance("demo-custext", drawn_from="demo").charged  # charged when the release was drawn
    assert not Provenance("synth", synthetic=SYNTHETIC).charged  # charged when its generating run trained
    assert not Provenance("demo", release=RELEASE).charged
    assert Provenance("demo", release=RELEASE).training_dataset == "demo-custext"
    assert Provenance("demo").training_dataset == "demo"


def test_a_run_on_a_local_dp_release_plans_the_releases_unit_and_no_epsilon_of_its_own() -> None:
    config = TrainConfig(dataset="demo", mechanism="custext", target_epsilon=2.0, embeddings="v.txt")
    as_built = _plan(config)
    assert as_built.unit != registry.get("custext").unit  # the mechanism alone: noiseless training
    planned = Provenance("demo", release=RELEASE).planned(as_built)
    assert (planned.unit, planned.epsilon, planned.delta) == (registry.get("custext").unit, math.inf, 0.0)
    assert planned.noise_to_signal is None and planned.mechanism is as_built.mechanism
    assert Provenance("demo").planned(as_built) is as_built  # the same configuration on the original text


def test_a_run_on_a_local_dp_release_states_the_releases_guarantee() -> None:
    trained = PrivacyStatement("custext", "none", rounds=30)
    stated = Provenance("demo", release=RELEASE).statement(trained, "custext")
    assert (stated.unit, stated.epsilon, stated.delta) == ("custext: epsilon 2 per token", 2.0, 0.0)
    assert stated.extra["epsilon_user_max"] == 60.0 and stated.rounds == 30


def test_synthetic_text_refuses_noise_and_states_its_generating_runs_guarantee() -> None:
    provenance = Provenance("synth", synthetic=SYNTHETIC)
    with pytest.raises(UedpError, match="noise here would protect only its made-up writers"):
        provenance.refuse(TrainConfig(dataset="synth", mechanism="dpsgd", noise_multiplier=1.0))
    noiseless = TrainConfig(dataset="synth", mechanism="noiseless")
    provenance.refuse(noiseless)  # post-processing: allowed
    planned = provenance.planned(_plan(noiseless))
    assert (planned.unit, planned.epsilon, planned.delta) == (GENERATING.unit, 3.0, 1e-5)
    trained = PrivacyStatement("noiseless", "none")
    stated = provenance.statement(trained, "noiseless")
    assert stated.epsilon == 3.0 and stated.unit == GENERATING.unit
    plain = Provenance("demo")
    assert plain.planned(_plan(noiseless)).epsilon == math.inf and plain.statement(trained, "noiseless") is trained


def test_read_from_the_data_home_an_original_corpus_is_charged_and_a_declared_public_one_is_not(home) -> None:  # type: ignore[no-untyped-def]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    config = TrainConfig(dataset="demo", mechanism="dpsgd", noise_multiplier=1.0, steps=2)
    read = Provenance.of(home, config)
    assert read == Provenance("demo") and read.charged
    assert reservation(home, _plan(config), read) is not None
    write_declaration(home, "demo", "the demo corpus is made up")
    declared = Provenance.of(home, config)
    assert declared.declared_public and not declared.charged
    assert reservation(home, _plan(config), declared) is None and reservation(home, _plan(config)) is None
