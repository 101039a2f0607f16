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
