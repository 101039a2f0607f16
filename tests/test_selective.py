"""Two-phase Selective DP for transformers: phase 1 sees only redacted text, the epsilon is the DP-SGD
phase's, and the pipeline wires the redacted corpus from the entities table."""

from __future__ import annotations

import pytest
import torch

from uedp.models.batching import encode
from uedp.models.metrics import causal_lm_loss, per_sequence_lm_loss
from uedp.privacy.accounting.events import epsilon_after, poisson_gaussian_round
from uedp.privacy.deid import redact
from uedp.privacy.mechanisms.base import RoundReport, TrainData
from uedp.privacy.mechanisms.selective import SelectiveParams, SelectiveTwoPhase

from support import TOKENIZER
from support import tiny_gpt2 as _model

ORIGINAL = [("Imelda Okafor called from Leeds", [(0, 13, "PERSON"), (26, 31, "GPE")]),
            ("the results arrive on Friday", []),
            ("ring Imelda Okafor back", [(5, 18, "PERSON")])] * 4


def _data() -> TrainData:
    return TrainData({"u": encode(TOKENIZER, [t for t, _ in ORIGINAL], 48)}, TOKENIZER.pad_token_id,
                     redacted={"u": encode(TOKENIZER, [redact(t, s) for t, s in ORIGINAL], 48)})


def test_phase_one_never_sees_a_sensitive_span_and_epsilon_is_the_dpsgd_phases() -> None:
    seen: list[str] = []

    def recording_loss(model, batch):  # type: ignore[no-untyped-def]
        seen.extend(TOKENIZER.decode([t for t in row.tolist() if t != TOKENIZER.pad_token_id])
                    for row in batch["input_ids"])
        return causal_lm_loss(model, batch)

    params = SelectiveParams(public_steps=3, steps=4, expected_batch_size=3, noise_multiplier=1.2)
    mechanism = SelectiveTwoPhase(params, n_examples=len(ORIGINAL), public_loss=recording_loss)
    reports: list[RoundReport] = []
    statement = mechanism.train(_model(), _data(), per_sequence_lm_loss, torch.device("cpu"), reports.append).statement
    assert seen and not any("Okafor" in text or "Leeds" in text for text in seen)
    assert any("[PERSON]" in text for text in seen)
    q = 3 / len(ORIGINAL)
    # F-neighbours change a token's value: replace-one adjacency, larger than DP-SGD's add/remove figure
    expected = [epsilon_after(poisson_gaussian_round(q, 1.2), t, 1e-5, "pld", "replace") for t in range(1, 5)]
    add_remove = epsilon_after(poisson_gaussian_round(q, 1.2), 4, 1e-5, "pld")
    assert expected[-1] > 1.2 * add_remove
    assert [r.round for r in reports] == list(range(1, 8))
    assert [r.epsilon for r in reports[:3]] == [0.0, 0.0, 0.0]
    assert [r.epsilon for r in reports[3:]] == pytest.approx(expected, rel=1e-6)
    assert statement.epsilon == pytest.approx(expected[-1]) and statement.rounds == 7


def test_selective_refuses_an_accountant_without_replace_one_support() -> None:
    with pytest.raises(ValueError, match="only the pld accountant"):
        SelectiveTwoPhase(SelectiveParams(public_steps=1, steps=1, accountant="rdp"), 5)


def test_selective_without_a_redacted_corpus_is_an_error() -> None:
    params = SelectiveParams(public_steps=1, steps=1)
    data = TrainData({"u": encode(TOKENIZER, ["x"], 8)}, TOKENIZER.pad_token_id)
    with pytest.raises(ValueError, match="needs the redacted corpus"):
        SelectiveTwoPhase(params, 1).train(_model(), data, per_sequence_lm_loss, torch.device("cpu"), lambda r: None)


def test_training_task_builds_the_redacted_corpus_from_the_entities_table(home) -> None:
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.services.config import TrainConfig
    from uedp.services.detect import detect_entities
    from uedp.services.training_data import load_training_texts
    from uedp.storage.catalog import Catalog
    from uedp.storage.ingest import IngestOptions, ingest

    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo")
    config = TrainConfig(dataset="demo", mechanism="selective", categories="PERSON,PHONE_NUMBER")
    with Catalog(home, "demo") as catalog:
        training = load_training_texts(catalog, config)
    originals = [t for texts in training.texts.values() for t in texts]
    redacted = [t for texts in training.redacted.values() for t in texts]
    assert len(originals) == len(redacted) and any("Okafor" in t for t in originals)
    assert not any("Okafor" in t or "+44" in t for t in redacted) and any("[PHONE_NUMBER]" in t for t in redacted)
    assert any("Northgate" in t for t in redacted)  # ORG was not chosen: kept
