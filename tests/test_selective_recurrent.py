"""Recurrent Selective-DPSGD: the regular update never depends on a private token's value, Opacus'
per-example gradients through the unrolled LSTM are exact, and epsilon is dp_accounting's replace-one
PLD of two releases per step."""

from __future__ import annotations

import math

import pytest
import torch
from opacus import GradSampleModule

from uedp.models.batching import encode_with_private_mask
from uedp.models.lstm import build_lstm
from uedp.models.metrics import causal_lm_loss
from uedp.models.tokenization import byte_level_tokenizer
from uedp.privacy.accounting.events import epsilon_after
from uedp.privacy.mechanisms.base import RoundReport, TrainData
from uedp.privacy.mechanisms.params import SelectiveParams
from uedp.privacy.mechanisms.selective_recurrent import SelectiveRecurrent, step_event

TOKENIZER = byte_level_tokenizer()
CPU = torch.device("cpu")
TEXTS = ["Call Anna Berg at home today.", "The clinic in Leeds opens at nine.", "Nothing private here."]
SPANS = [[(5, 14)], [(14, 19)], []]


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_lstm("tiny", len(TOKENIZER))


def _encoded(texts: list[str]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return encode_with_private_mask(TOKENIZER, texts, SPANS, 64)


def _gradients(mechanism: SelectiveRecurrent, model: torch.nn.Module, texts: list[str], seed: int = 5) -> torch.Tensor:
    ids, masks = _encoded(texts)
    private = GradSampleModule(model, strict=False, loss_reduction="sum")
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        grads = mechanism.step_gradients(private, model, params, ids, masks, TOKENIZER.pad_token_id, CPU,
                                         torch.Generator().manual_seed(seed))
    finally:
        private.remove_hooks()
    return torch.cat([g.reshape(-1) for g in grads])


def test_regular_update_does_not_see_a_private_token() -> None:
    # Vanishing clips remove the private update and make each released state pure (vanishing) noise: any
    # other path from a private token into the regular update would show as a difference.
    mechanism = SelectiveRecurrent(SelectiveParams(clip=1e-12, hidden_clip=1e-12, noise_multiplier=1.0), 10)
    base = _gradients(mechanism, _model(), TEXTS)
    private_changed = _gradients(mechanism, _model(), ["Call Omar Khan at home today."] + TEXTS[1:])
    public_changed = _gradients(mechanism, _model(), ["Ring Anna Berg at home today."] + TEXTS[1:])
    assert torch.allclose(base, private_changed, atol=1e-9)
    assert not torch.allclose(base, public_changed, atol=1e-6)


def test_private_gradient_is_the_sum_of_single_sequence_gradients() -> None:
    """No noise, no clipping: Opacus' per-example gradients through the unrolled cell equal each sequence's own."""
    mechanism = SelectiveRecurrent(SelectiveParams(clip=1e4, hidden_clip=1e4, noise_multiplier=1e-12,
                                                            expected_batch_size=3), 10)
    batch = _gradients(mechanism, _model(), TEXTS)
    ids, masks = _encoded(TEXTS)
    model = _model()
    params = [p for p in model.parameters() if p.requires_grad]

    def release(h, c, rows, t):  # type: ignore[no-untyped-def]
        return h.detach(), c.detach()

    def losses(rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        from uedp.models.batching import IGNORE, collate

        inputs = collate([ids[r] for r in rows], TOKENIZER.pad_token_id)
        private = torch.zeros_like(inputs["input_ids"], dtype=torch.bool)
        for i, r in enumerate(rows):
            private[i, : len(masks[r])] = masks[r]
        logits = model.forward_releasing_states(inputs["input_ids"], private, release)
        targets = inputs["labels"][:, 1:]
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), targets, ignore_index=IGNORE,
                                                reduction="none")
        valid = targets != IGNORE
        private_loss = (private[:, :-1] | private[:, 1:]) & valid
        public = valid & ~private_loss
        return (nll * public).sum() / public.sum(), ((nll * private_loss).sum(1) / private_loss.sum(1).clamp(min=1)).sum()

    regular = torch.autograd.grad(losses([0, 1, 2])[0], params)
    singles = [torch.autograd.grad(losses([r])[1], params, allow_unused=True) for r in range(3)]
    expected = [reg + sum((s[i] if s[i] is not None else torch.zeros_like(reg)) for s in singles) / 3
                for i, reg in enumerate(regular)]
    assert torch.allclose(batch, torch.cat([e.reshape(-1) for e in expected]), atol=1e-5)


def test_trains_and_reports_replace_one_epsilon_of_two_releases_per_step() -> None:
    ids, masks = _encoded(TEXTS)
    data = TrainData({"u": ids * 3}, TOKENIZER.pad_token_id, private_masks={"u": masks * 3})
    mechanism = SelectiveRecurrent(SelectiveParams(steps=4, expected_batch_size=3, noise_multiplier=1.5,
                                                            lr=1e-2, delta=1e-3), 9)
    reports: list[RoundReport] = []
    statement = mechanism.train(_model(), data, causal_lm_loss, CPU, reports.append).statement
    expected = [epsilon_after(step_event(3 / 9, 1.5), t, 1e-3, "pld", "replace") for t in range(1, 5)]
    assert [r.epsilon for r in reports] == pytest.approx(expected, rel=1e-6)
    one_release = epsilon_after(step_event(3 / 9, 1.5 * math.sqrt(2)), 4, 1e-3, "pld", "replace")
    assert statement.epsilon > one_release  # the state release is paid for, not just the gradient
    assert statement.extra["releases_per_step"] == 2.0


def test_needs_the_lstm_and_the_private_masks() -> None:
    from uedp.models.gpt2 import build_gpt2

    ids, _ = _encoded(TEXTS)
    mechanism = SelectiveRecurrent(SelectiveParams(steps=1), 3)
    with pytest.raises(ValueError, match="LSTM"):
        mechanism.train(build_gpt2("tiny", len(TOKENIZER), TOKENIZER.eos_token_id), TrainData({"u": ids}, 0),
                        causal_lm_loss, CPU, lambda r: None)
    with pytest.raises(ValueError, match="private-token mask"):
        mechanism.train(_model(), TrainData({"u": ids}, 0), causal_lm_loss, CPU, lambda r: None)


def test_training_task_marks_the_entity_tokens_of_the_chosen_categories(home) -> None:  # type: ignore[no-untyped-def]
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.services.config import TrainConfig
    from uedp.services.detect import detect_entities
    from uedp.services.training import train_configuration
    from uedp.services.training_data import prepare_data
    from uedp.storage.catalog import Catalog
    from uedp.storage.ingest import IngestOptions, ingest

    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    config = TrainConfig(dataset="demo", mechanism="selective", model="lstm", categories=["PER"], steps=2,
                         checkpoint_every=0)
    with Catalog(home, "demo") as catalog:
        data = prepare_data(catalog, config, TOKENIZER)
        person_spans = catalog.entity_spans(["PERSON"], "train")
        rows = catalog.sentences("train")
    first_id, user, text = next(row for row in rows if row[0] in person_spans)
    start, end, _, _ = person_spans[first_id][0]
    position = [t for _, u, t in rows if u == user].index(text)  # sentences keep corpus order within a user
    mask, ids = data.train.private_masks[user][position], data.train.by_user[user][position]
    marked = TOKENIZER.decode([i for i, m in zip(ids.tolist(), mask.tolist()) if m])
    assert marked == text[start:end] and data.train.redacted is None
    result = train_configuration(home, config, progress=False)
    assert 0 < result.epsilon < math.inf and result.rounds == 2
