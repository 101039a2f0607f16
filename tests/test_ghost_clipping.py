"""Ghost clipping is exact: every per-example norm, and the clipped sum, equal those of the materialised
per-example gradient (each example's own backward pass) for GPT-2 (Conv1D, the tied input/output
embedding, position embeddings, layer norms), a BERT classifier (padding index, pooler), the LSTM
(a layer applied once per time step) and a layer without a rule (the torch.func fallback); under both
strategies (Gram-matrix norms and materialised per-layer gradients). Models run in float64, so the
tolerance 1e-5 measures the method, not float32 rounding. The causal-LM families and LoRA adapters are
verified in tests/test_per_sample_families.py."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from uedp.models.batching import collate, encode
from uedp.models.classifier import build_bert_classifier
from uedp.models.lstm import build_lstm, build_lstm_classifier
from uedp.models.metrics import classification_loss, per_sequence_lm_loss
from uedp.privacy.per_sample.factors import Outer
from uedp.privacy.per_sample.ghost import GhostClipping
from uedp.privacy.per_sample.layers import rule_name

from support import TOKENIZER, tiny_gpt2

TEXTS = ["hello world", "Anna Berg lives in Leeds", "x", "call +44 7700 900123 today please", "Leeds Leeds Leeds"]
STRATEGIES = ("ghost", "materialise", "auto")


def _lm_batch(texts: list[str]) -> dict[str, torch.Tensor]:
    return collate(encode(TOKENIZER, texts, 48), TOKENIZER.pad_token_id)


def _reference(model: nn.Module, loss_fn, examples: list[dict[str, torch.Tensor]]) -> list[list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    """Each example's gradient from its own backward pass (a batch of one): the materialised truth."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for example in examples:
        model.zero_grad()
        loss_fn(model, example).backward()
        out.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params])
    model.zero_grad(set_to_none=True)
    return out


def _norms(reference: list[list[torch.Tensor]]) -> torch.Tensor:
    return torch.stack([torch.sqrt(sum((g.double() ** 2).sum() for g in grads)) for grads in reference])


def _clipped(reference: list[list[torch.Tensor]], clip: float) -> list[torch.Tensor]:
    norms = _norms(reference)
    return [sum(min(1.0, clip / float(n)) * grads[k] for grads, n in zip(reference, norms))
            for k in range(len(reference[0]))]


def _check(model: nn.Module, loss_fn, batch: dict[str, torch.Tensor], singles: list[dict[str, torch.Tensor]],  # type: ignore[no-untyped-def]
           strategy: str) -> None:
    reference = _reference(model, loss_fn, singles)
    norms = _norms(reference)
    # A clip between the smallest and the largest norm: some examples are clipped, some are not.
    clip = float(norms.median())
    engine = GhostClipping(model, "mean", strategy)  # type: ignore[arg-type]
    try:
        assert torch.allclose(engine.per_example_norms(loss_fn, batch, len(singles)), norms, rtol=1e-5, atol=0)
        for bound in (clip, float(norms.min()) / 10):  # some examples clipped; every example clipped
            got, want = engine.clipped_sum(loss_fn, batch, len(singles), bound), _clipped(reference, bound)
            scale = max(float(t.abs().max()) for t in want)  # a gradient that is zero in theory (BERT's key bias) is ~1e-20
            for k, (mine, truth) in enumerate(zip(got, want)):
                assert torch.allclose(mine, truth, rtol=1e-5, atol=1e-9 * scale), f"parameter {k}, clip {bound:g}"
    finally:
        engine.close()
    assert all(p.grad is None for p in model.parameters())  # no weight gradient was computed or left behind
    assert not any(m._forward_hooks for m in model.modules())  # close() gives the plain model back


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gpt2_clipped_sum_equals_materialised_per_example_gradients(strategy: str) -> None:
    model = tiny_gpt2().double()
    assert model.lm_head.weight is model.transformer.wte.weight  # the tied embedding is in the test
    assert {rule_name(m) for m in model.modules() if any(p.requires_grad for p in m.parameters(recurse=False))} == {"ghost"}
    _check(model, per_sequence_lm_loss, _lm_batch(TEXTS), [_lm_batch([t]) for t in TEXTS], strategy)


def test_tied_embedding_norm_includes_the_cross_term() -> None:
    """The trap: a tied weight's per-example gradient is the *sum* of its input and output uses. The norm of
    the sum is what clipping needs; the norms of the uses combined without their inner product are not."""
    model = tiny_gpt2().double()
    batch = _lm_batch(TEXTS)
    engine = GhostClipping(model, "mean", "ghost")
    factors = engine._recorded_factors(per_sequence_lm_loss, batch, len(TEXTS))[model.transformer.wte.weight]
    engine.close()
    embedding, head = sorted(factors, key=lambda f: not isinstance(f, Outer) or not f.one_hot)
    assert isinstance(embedding, Outer) and embedding.one_hot and isinstance(head, Outer) and not head.one_hot
    whole = (embedding.materialise() + head.materialise()).flatten(1).pow(2).sum(1)
    by_gram = embedding.inner(embedding) + head.inner(head) + 2 * embedding.inner(head)
    assert torch.allclose(by_gram, whole, rtol=1e-10)
    without_cross = embedding.inner(embedding) + head.inner(head)
    assert ((without_cross - whole).abs() / whole).max() > 1e-3  # an implementation missing it would be caught


@pytest.mark.parametrize("strategy", ("ghost", "materialise"))
def test_bert_classifier_with_padding_index_and_pooler(strategy: str) -> None:
    torch.manual_seed(0)
    model = build_bert_classifier("tiny", len(TOKENIZER), 3, TOKENIZER.pad_token_id).double()
    examples = [(ids, label) for ids, label in zip(encode(TOKENIZER, TEXTS, 32), [0, 1, 2, 1, 0])]
    _check(model, classification_loss, collate(examples, TOKENIZER.pad_token_id),
           [collate([e], TOKENIZER.pad_token_id) for e in examples], strategy)


def test_lstm_layers_applied_at_every_time_step() -> None:
    torch.manual_seed(0)
    model = build_lstm("tiny", len(TOKENIZER)).double()
    _check(model, per_sequence_lm_loss, _lm_batch(TEXTS[:4]), [_lm_batch([t]) for t in TEXTS[:4]], "auto")


def test_lstm_classifier_reading_each_row_at_its_last_real_token() -> None:
    """The classifier head reads the state after each row's last real token (rows of different lengths,
    right-padded): each example's clipped gradient must still be exactly its own."""
    torch.manual_seed(0)
    model = build_lstm_classifier("tiny", len(TOKENIZER), 3).double()
    examples = [(ids, label) for ids, label in zip(encode(TOKENIZER, TEXTS, 32), [0, 1, 2, 1, 0])]
    _check(model, classification_loss, collate(examples, TOKENIZER.pad_token_id),
           [collate([e], TOKENIZER.pad_token_id) for e in examples], "auto")


class _Scaled(nn.Module):
    """A layer no rule covers: an elementwise learned scale."""

    def __init__(self, width: int):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def test_a_layer_without_a_rule_is_materialised_exactly_by_torch_func() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), _Scaled(8), nn.Linear(8, 3)).double()
    assert rule_name(model[2]) == "materialised" and rule_name(model[0]) == "ghost"
    x, y = torch.randn(5, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 1, 0])

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(m(batch["x"]), batch["y"])

    _check(model, loss_fn, {"x": x, "y": y}, [{"x": x[i:i + 1], "y": y[i:i + 1]} for i in range(5)], "auto")


def test_a_non_finite_example_counts_zero() -> None:
    model = nn.Sequential(nn.Linear(4, 2)).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    x[1, 0] = math.inf

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return m(batch["x"]).pow(2).sum(1).mean()

    engine = GhostClipping(model, "mean", "ghost")
    got = engine.clipped_sum(loss_fn, {"x": x}, 3, 1.0)
    engine.close()
    keep = torch.tensor([0, 2])
    clean = GhostClipping(model, "mean", "ghost")
    want = clean.clipped_sum(lambda m, b: loss_fn(m, b) * 2 / 3, {"x": x[keep]}, 2, 1.0)  # the two finite examples
    clean.close()
    for mine, truth in zip(got, want):
        assert torch.isfinite(mine).all() and torch.allclose(mine, truth, rtol=1e-9)


def test_a_broadcast_position_input_is_refused_not_silently_summed() -> None:
    model = tiny_gpt2()
    batch = _lm_batch(TEXTS[:2])

    def without_positions(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:  # GPT-2 then uses (1, T) positions
        return m(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.float().mean()

    engine = GhostClipping(model, "mean")
    with pytest.raises(ValueError, match=r"batch in dimension 0.*Embedding"):
        engine.clipped_sum(without_positions, batch, 2, 1.0)
    engine.close()


def test_an_embedding_padding_index_gets_no_gradient_as_in_pytorch() -> None:
    torch.manual_seed(0)

    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(10, 4, padding_idx=0)
            self.out = nn.Linear(4, 2)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.out(self.embedding(ids).sum(1))

    model = Bag().double()
    ids, y = torch.tensor([[0, 3, 0, 5], [1, 0, 0, 2], [0, 0, 0, 7]]), torch.tensor([0, 1, 1])

    def loss_fn(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(m(batch["ids"]), batch["y"])

    _check(model, loss_fn, {"ids": ids, "y": y}, [{"ids": ids[i:i + 1], "y": y[i:i + 1]} for i in range(3)], "ghost")


def test_layers_ghost_clipping_cannot_see_are_refused_not_left_out() -> None:
    """A layer with parameters that returns a tuple, or whose output is changed in place afterwards, would
    have its gradient silently left out: both are errors that name the layer."""
    lstm = nn.Sequential(nn.LSTM(3, 4, batch_first=True))
    engine = GhostClipping(lstm, "mean")
    with pytest.raises(ValueError, match="LSTM, whose output is not one tensor"):
        engine.clipped_sum(lambda m, b: m(b["x"])[0].sum(), {"x": torch.randn(2, 5, 3)}, 2, 1.0)
    engine.close()

    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.linear(x)
            y.mul_(2)
            return y

    engine = GhostClipping(InPlace(), "mean")
    with pytest.raises(ValueError, match="Linear was changed in place"):
        engine.clipped_sum(lambda m, b: m(b["x"]).sum(), {"x": torch.randn(2, 3)}, 2, 1.0)
    engine.close()


def test_a_parameter_used_outside_the_layer_that_owns_it_is_refused_not_left_out() -> None:
    """A parent reading its child's weight directly (as peft's LoRA embedding reads its ParameterDicts): no
    recorded call sees that use, so ghost clipping names the parameter instead of missing its gradient."""
    class Reuse(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = nn.Linear(3, 3), nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.second(self.first(x) @ self.second.weight.T.expand(3, 3))

    engine = GhostClipping(Reuse(), "mean")
    with pytest.raises(ValueError, match=r"outside the layers that own them \(second.weight\)"):
        engine.clipped_sum(lambda m, b: m(b["x"]).sum(), {"x": torch.randn(2, 3)}, 2, 1.0)
    engine.close()


def test_an_unverified_architecture_takes_the_exact_path_with_a_warning() -> None:
    from uedp.privacy.per_sample import per_sample_clipping
    from uedp.privacy.per_sample.exact import ExactClipping
    from uedp.privacy.per_sample.opacus_path import OpacusClipping

    with pytest.warns(UserWarning, match="not verified for Sequential: per-example gradients by each example's own"):
        clipping = per_sample_clipping(nn.Sequential(nn.Linear(3, 2)), "ghost")
    assert isinstance(clipping, ExactClipping)
    clipping.close()
    verified = per_sample_clipping(tiny_gpt2(), "ghost")
    assert isinstance(verified, GhostClipping)
    verified.close()
    asked = per_sample_clipping(nn.Sequential(nn.Linear(3, 2)), "opacus")  # Opacus' path when asked for
    assert isinstance(asked, OpacusClipping)
    asked.close()
