"""The local-DP samplers' epsilons, checked exactly over every pair of inputs (``privacy.sanitization``).

tests/test_sanitization.py checks the sampling distributions and the ratio inside CusText's input sets;
these check the figure each sampler *reports*: SanText's headline per-token epsilon (``eps`` times the
vocabulary's diameter) bounds the ratio of every output's probability under any two inputs, its metric-DP
form bounds each pair by ``eps * d(x, x')``, and a sampler that reported the metric ``eps`` as its
per-token epsilon is caught. The diameter's bound for a large vocabulary never falls below the true one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from uedp.privacy.sanitization.embeddings import Embeddings
from uedp.privacy.sanitization.mapping import build_mapping
from uedp.privacy.sanitization.mechanisms import KEEP, UNKNOWN, CusText, SanText, _diameter, privatize, sample


def _random_embeddings(n: int, dim: int, seed: int) -> Embeddings:
    rng = np.random.default_rng(seed)
    return Embeddings([f"w{i}" for i in range(n)], rng.normal(size=(n, dim)).astype(np.float32))


def _worst_log_ratio(probs: np.ndarray) -> float:
    """max over outputs y and inputs x, x' of log Pr[y|x] - log Pr[y|x'] (rows: inputs, columns: outputs)."""
    logs = np.log(probs)
    return float((logs.max(axis=0) - logs.min(axis=0)).max())


@pytest.mark.parametrize("epsilon", [0.5, 3.0])
def test_santexts_reported_per_token_epsilon_bounds_every_pair_of_inputs(epsilon: float) -> None:
    embeddings = _random_embeddings(40, 3, seed=1)
    sampler = SanText(embeddings, epsilon)
    _, probs = sampler.distribution(np.arange(40))
    assert _worst_log_ratio(probs) <= sampler.per_token_epsilon * (1 + 1e-9)
    # the bound is the pure-LDP one over the whole vocabulary: far above the metric eps itself
    assert sampler.per_token_epsilon > epsilon


def test_santext_is_metric_dp_for_each_pair_by_its_distance() -> None:
    embeddings = _random_embeddings(25, 4, seed=2)
    epsilon = 1.2
    _, probs = SanText(embeddings, epsilon).distribution(np.arange(25))
    vectors = torch.from_numpy(embeddings.vectors).double()
    distance = torch.cdist(vectors, vectors).numpy()
    logs = np.log(probs)
    for x in range(25):
        for other in range(25):
            assert np.max(logs[x] - logs[other]) <= epsilon * distance[x, other] * (1 + 1e-6) + 1e-9


def test_a_sampler_reporting_the_metric_epsilon_as_its_per_token_epsilon_is_caught() -> None:
    """The check above is not vacuous: a SanText that claimed ``eps`` per token would fail it."""

    class Understated(SanText):
        @property
        def per_token_epsilon(self) -> float:
            return self.epsilon

    sampler = Understated(_random_embeddings(30, 3, seed=3), 1.0)
    _, probs = sampler.distribution(np.arange(30))
    assert _worst_log_ratio(probs) > sampler.per_token_epsilon


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_custext_scores_lie_in_zero_one_and_its_ratio_inside_an_input_set_is_at_most_epsilon(metric: str) -> None:
    embeddings = _random_embeddings(80, 5, seed=4)
    epsilon = 2.0
    mapping = build_mapping(embeddings, 8, "conservative", metric=metric)  # type: ignore[arg-type]
    sampler = CusText(embeddings, mapping, epsilon, metric=metric)  # type: ignore[arg-type]
    sets, scores = sampler.scores(np.arange(80))
    valid = sets >= 0
    assert np.all((scores.numpy()[valid] >= 0) & (scores.numpy()[valid] <= 1))
    assert np.all(np.isneginf(scores.numpy()[~valid]))
    for group in range(len(mapping.output_sets)):
        inputs = np.flatnonzero(mapping.group_of == group)
        if len(inputs) > 1:
            members, probs = sampler.distribution(inputs)
            assert (members == members[0]).all()  # one output set for the whole input set
            assert _worst_log_ratio(probs[:, members[0] >= 0]) <= epsilon * (1 + 1e-9)


def test_custext_on_an_output_set_of_equidistant_members_is_uniform() -> None:
    embeddings = Embeddings(["a", "b", "c"], np.asarray([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.0]], dtype=np.float32))
    mapping = build_mapping(embeddings, 3, "aggressive")
    sampler = CusText(embeddings, mapping, epsilon=5.0)
    members, probs = sampler.distribution(np.asarray([0]))
    # a's set holds a (distance 0) and b, c (distance 1): b and c must be equally likely
    b, c = (np.flatnonzero(members[0] == i)[0] for i in (1, 2))
    assert probs[0, b] == pytest.approx(probs[0, c])
    assert probs[0].sum() == pytest.approx(1.0)


@pytest.mark.parametrize("epsilon", [0.0, -1.0, float("nan")])
def test_a_non_positive_epsilon_is_refused_by_both_samplers(epsilon: float) -> None:
    embeddings = _random_embeddings(6, 2, seed=5)
    with pytest.raises(ValueError, match="epsilon must be positive"):
        SanText(embeddings, epsilon)
    with pytest.raises(ValueError, match="epsilon must be positive"):
        CusText(embeddings, build_mapping(embeddings, 2, "aggressive"), epsilon)


def test_the_diameter_is_exact_for_a_small_vocabulary_and_an_upper_bound_above_it() -> None:
    vectors = torch.from_numpy(_random_embeddings(300, 6, seed=6).vectors)
    exact = float(torch.cdist(vectors, vectors).max())
    assert _diameter(vectors, chunk=64) == pytest.approx(exact)
    bound = _diameter(vectors, exact_up_to=100)
    assert exact <= bound <= 2 * exact  # never understates the epsilon it multiplies


def test_the_same_seed_draws_the_same_release_from_either_kind_of_generator() -> None:
    embeddings = _random_embeddings(50, 4, seed=7)
    sampler = CusText(embeddings, build_mapping(embeddings, 5, "balanced"), epsilon=1.0)
    tokens = np.random.default_rng(0).integers(0, 50, size=200)
    torch_draws = [sample(sampler, tokens, torch.Generator().manual_seed(11)) for _ in range(2)]
    numpy_draws = [sample(sampler, tokens, np.random.default_rng(11)) for _ in range(2)]
    assert np.array_equal(*torch_draws) and np.array_equal(*numpy_draws)
    for drawn in (*torch_draws, *numpy_draws):  # each draw stays in its token's output set
        for token, out in zip(tokens, drawn):
            assert out in sampler.mapping.output_set(int(token))


def test_kept_and_unknown_positions_pass_through_and_empty_input_gives_empty_output() -> None:
    embeddings = _random_embeddings(20, 3, seed=8)
    sampler = SanText(embeddings, epsilon=math.log(2))
    records = [np.asarray([KEEP, 3, UNKNOWN, 4]), np.asarray([], dtype=np.int64), np.asarray([UNKNOWN])]
    released = privatize(records, sampler, torch.Generator().manual_seed(0))
    assert [len(r) for r in released] == [4, 0, 1]
    assert released[0][0] == KEEP and released[0][2] == UNKNOWN and released[2][0] == UNKNOWN
    assert 0 <= released[0][1] < 20 and 0 <= released[0][3] < 20
    assert privatize([], sampler, torch.Generator()) == []
    assert len(sample(sampler, np.asarray([], dtype=np.int64), torch.Generator())) == 0
