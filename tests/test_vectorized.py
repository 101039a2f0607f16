"""Vectorized local updates reproduce the sequential trainer's clipped sum (same batches, same order)."""

from __future__ import annotations

import torch
from torch.nn.utils import parameters_to_vector

from uedp.models.batching import encode
from uedp.models.metrics import causal_lm_loss
from uedp.privacy.mechanisms.fedavg import LocalTrainer
from uedp.privacy.mechanisms.vectorized import VectorizedLocalTrainer

from support import TOKENIZER
from support import tiny_gpt2 as _model


def test_vectorized_clipped_sum_equals_the_sequential_one() -> None:
    users = [encode(TOKENIZER, [f"user {u} line {i} " + "x" * (u * 3 + i) for i in range(2 + u)], 48) for u in range(5)]
    users.insert(2, [])  # a user with nothing to train on this round contributes nothing
    weights = [1.0, 0.5, 1.0, 0.25, 1.0, 0.75]
    model = _model()
    theta = parameters_to_vector(model.parameters()).detach().clone()
    args = (model, causal_lm_loss, torch.device("cpu"), TOKENIZER.pad_token_id, 0.3, 3, 2, 0.5)
    def streams(seed: int) -> list[torch.Generator]:  # one stream per user, as training derives them
        return [torch.Generator().manual_seed(seed * 100 + u) for u in range(len(users))]

    sequential = LocalTrainer(*args).clipped_sum(theta, users, weights, streams(4))
    vectorized = VectorizedLocalTrainer(*args, group_size=4).clipped_sum(theta, users, weights, streams(4))
    assert float(torch.linalg.vector_norm(sequential)) > 0.1
    assert torch.allclose(vectorized, sequential, rtol=1e-4, atol=1e-6)
    other_order = VectorizedLocalTrainer(*args).clipped_sum(theta, users, weights, streams(5))
    assert not torch.allclose(other_order, sequential, rtol=1e-4, atol=1e-6)  # the check can tell batches apart


def test_userdp_with_vectorized_users_trains_the_same_model() -> None:
    from test_userdp import _data

    from uedp.privacy.mechanisms.userdp import UserDp, UserDpParams
    from uedp.privacy.population import Population
    from uedp.privacy.randomness import Randomness

    models = []
    for vectorize in (False, True):
        params = UserDpParams(rounds=2, q_user=0.5, local_steps=2, accountant="rdp", vectorize_users=vectorize)
        model = _model()
        UserDp(params, Population.declared(12), Randomness.seeded(3)).train(model, _data(), causal_lm_loss, torch.device("cpu"), lambda r: None)
        models.append(parameters_to_vector(model.parameters()).detach())
    assert torch.allclose(models[0], models[1], rtol=1e-4, atol=1e-5)


def test_a_diverged_users_delta_adds_nothing_to_either_trainers_sum(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A user whose local update is not finite (diverged) counts as zero: its NaN must not reach the sum (0 * NaN
    is NaN: a NaN release would be unbounded in sensitivity and reveal that the user took part)."""
    users = [encode(TOKENIZER, [f"user {u} line {i} " + "x" * (u * 3 + i) for i in range(3)], 48) for u in range(4)]
    weights = [1.0, 0.5, 1.0, 0.25]
    model = _model()
    theta = parameters_to_vector(model.parameters()).detach().clone()
    args = (model, causal_lm_loss, torch.device("cpu"), TOKENIZER.pad_token_id, 0.3, 2, 2, 0.5)

    def streams(indices: list[int]) -> list[torch.Generator]:
        return [torch.Generator().manual_seed(100 + u) for u in indices]

    real_local, real_group = LocalTrainer.local_delta, VectorizedLocalTrainer._group_deltas

    def diverged_local(self, theta, sequences, stream):  # type: ignore[no-untyped-def]
        delta = real_local(self, theta, sequences, stream)
        return torch.full_like(delta, float("nan")) if sequences is users[1] else delta

    def diverged_group(self, theta, group, group_streams):  # type: ignore[no-untyped-def]
        deltas = real_group(self, theta, group, group_streams)
        for row, sequences in enumerate(group):
            if sequences is users[1]:
                deltas[row] = float("inf")
        return deltas

    without = [0, 2, 3]
    for trainer in (LocalTrainer(*args), VectorizedLocalTrainer(*args, group_size=4)):
        expected = trainer.clipped_sum(theta, [users[i] for i in without], [weights[i] for i in without],
                                       streams(without))
        monkeypatch.setattr(LocalTrainer, "local_delta", diverged_local)
        monkeypatch.setattr(VectorizedLocalTrainer, "_group_deltas", diverged_group)
        total = trainer.clipped_sum(theta, users, weights, streams([0, 1, 2, 3]))
        monkeypatch.undo()
        assert bool(torch.isfinite(total).all()) and float(torch.linalg.vector_norm(expected)) > 0.1
        assert torch.allclose(total, expected, rtol=1e-5, atol=1e-7)
