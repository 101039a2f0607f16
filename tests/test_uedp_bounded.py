"""uedp-bounded (multi-attribution DP): the holder choice depends on the attribution graph only and
bounds every entity to k users; on constructed (user, entity)-adjacent datasets the noiseless sum moves
by at most 2 beta (1 + k) with the run's real local randomness; the group accountant equals
dp_accounting computed directly and upper-bounds the exact one-round privacy curve of the group; the
calibration meets its target; the planner and the sweep's grid know the mechanism."""

from __future__ import annotations

import math
import random
from concurrent.futures import Future

import dp_accounting
import numpy as np
import pytest
import torch
from scipy import integrate, stats
from torch.nn.utils import parameters_to_vector
from typer.testing import CliRunner

from uedp.cli import app
from uedp.models.batching import encode
from uedp.models.metrics import causal_lm_loss
from uedp.privacy import attribution
from uedp.privacy.accounting import events
from uedp.privacy.accounting import rounds as round_accounting
from uedp.privacy.accounting.events import epsilon_after, group_replace_round
from uedp.privacy.accounting.rounds import RoundAccountant
from uedp.privacy.attribution import AttributionGraph, choose_holders
from uedp.privacy.mechanisms import userdp as userdp_module
from uedp.privacy.mechanisms.base import TrainData
from uedp.privacy.mechanisms.fedavg import LocalTrainer, user_weights
from uedp.privacy.mechanisms.uedp_bounded import KeptHolders, UeDpBounded, UeDpBoundedParams, bounded_training_data
from uedp.privacy.randomness import Randomness
from uedp.services.sweep_config import SweepConfig

from support import TOKENIZER
from support import tiny_gpt2 as _model

CPU = torch.device("cpu")
STRATEGIES = ("gain", "top-count", "ascending-degree", "best")


# --- the holder choice --------------------------------------------------------------------------------


def _random_entity_sets(seed: int, users: int = 30, entities: int = 25) -> dict[str, list[frozenset[str]]]:
    """Users with 3-12 sentences, each with 0-3 entities drawn with a popularity skew (some entities
    are mentioned by many users, most by few)."""
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(entities)]
    out: dict[str, list[frozenset[str]]] = {}
    for u in range(users):
        sets = []
        for _ in range(rng.randint(3, 12)):
            count = rng.choice([0, 1, 1, 2, 3])
            sets.append(frozenset(f"PERSON:name {e}" for e in rng.choices(range(entities), weights, k=count)))
        out[f"doc#{u:03d}"] = sets
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_entity_has_at_most_k_holders_and_a_sentence_is_kept_only_where_all_its_entities_are_held(
        seed: int, k: int, strategy: str) -> None:
    graph = AttributionGraph.from_entity_sets(_random_entity_sets(seed))
    choice = choose_holders(graph, k, strategy)  # type: ignore[arg-type]
    assert choice.max_holders <= k
    users_of = graph.users_of()
    for e, holders in enumerate(choice.holders):
        assert holders <= users_of[e]  # a holder mentions the entity
    for u, user in enumerate(graph.sentences):
        for s, ids in enumerate(user):
            assert choice.kept[u][s] == all(u in choice.holders[e] for e in ids)
    assert choice.sensitive_kept == sum(choice.kept[u][s] for u, user in enumerate(graph.sentences)
                                        for s, ids in enumerate(user) if ids)
    if k == 0:
        assert choice.sensitive_kept == 0


@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_improved_choices_keep_more_sentences_than_the_baseline_greedy(k: int) -> None:
    """Summed over skewed random graphs, each improved strategy keeps strictly more than the baseline
    (on CoNLL-2003: benchmarks/holder_choice.py), and local search never loses what a greedy kept."""
    totals = dict.fromkeys(STRATEGIES, 0)
    for seed in range(6):
        graph = AttributionGraph.from_entity_sets(_random_entity_sets(seed, users=40, entities=30))
        for strategy in STRATEGIES:
            totals[strategy] += choose_holders(graph, k, strategy).sensitive_kept  # type: ignore[arg-type]
        unimproved = attribution._kept_count(graph, attribution._gain_greedy(graph, k))
        assert choose_holders(graph, k, "gain").sensitive_kept >= unimproved
    assert totals["gain"] > totals["ascending-degree"] and totals["top-count"] > totals["ascending-degree"]


def test_enough_holders_keep_every_sentence() -> None:
    graph = AttributionGraph.from_entity_sets(_random_entity_sets(0))
    k = max(len(users) for users in graph.users_of())
    assert choose_holders(graph, k).sensitive_kept == graph.n_sensitive


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_choice_depends_on_the_graph_only_not_on_entity_names_or_text(strategy: str) -> None:
    """Renaming every entity (a bijection to unrelated strings, which reverses their sort order) keeps
    the graph and must keep the choice: names are private contents under the adjacency."""
    original = _random_entity_sets(3)
    rename = {key: f"ORG:{'z' * (i % 7)}{1000 - i}" for i, key in
              enumerate(sorted({k for sets in original.values() for s in sets for k in s}))}
    renamed = {u: [frozenset(rename[k] for k in s) for s in sets] for u, sets in original.items()}
    a = choose_holders(AttributionGraph.from_entity_sets(original), 2, strategy)  # type: ignore[arg-type]
    b = choose_holders(AttributionGraph.from_entity_sets(renamed), 2, strategy)  # type: ignore[arg-type]
    assert a.kept == b.kept and a.holders == b.holders


def test_entities_that_occur_in_the_same_sentences_are_one_for_the_choice() -> None:
    sets = {"u0": [frozenset({"PERSON:ann", "ORG:acme"})], "u1": [frozenset({"PERSON:ann", "ORG:acme"})]}
    graph = AttributionGraph.from_entity_sets(sets)
    assert graph.n_entities == 1
    assert choose_holders(graph, 1).sensitive_kept == 1  # one user keeps its sentence: it holds "both"


# --- sensitivity on constructed adjacent datasets, with the run's own randomness -----------------------

SHARED = "PERSON:imelda okafor"
SPREAD = 6  # users that mention SHARED (more than k)


def _adjacent_pair(k: int) -> tuple[TrainData, TrainData, str]:
    """D and D' differing in the contents of every sentence of user u7 and every sentence with SHARED,
    the attribution graph unchanged; u7 does not mention SHARED, so up to 1 + k users change."""
    by_user: dict[str, list[str]] = {}
    entity_sets: dict[str, list[frozenset[str]]] = {}
    for u in range(8):
        texts = [f"harmless note number {u} about the weather", f"Dr Berg at Northgate Clinic saw patient {u}"]
        sets = [frozenset(), frozenset({f"PERSON:dr berg {u % 3}"})]
        if u < SPREAD:
            texts.append(f"Imelda Okafor visited ward {u} and signed the chart")
            sets.append(frozenset({SHARED}))
        by_user[f"u{u}"], entity_sets[f"u{u}"] = texts, sets
    changed = {u: [("Quentin Marlowe changed everything in note " + str(i)) if (u == "u7" or SHARED in s) else t
                   for i, (t, s) in enumerate(zip(texts, entity_sets[u]))] for u, texts in by_user.items()}

    def data(texts: dict[str, list[str]]) -> TrainData:
        return TrainData({u: encode(TOKENIZER, t, 64) for u, t in texts.items()}, TOKENIZER.pad_token_id,
                         {u: list(s) for u, s in entity_sets.items()})

    return data(by_user), data(changed), "u7"


def _per_user_contributions(data: TrainData, params: UeDpBoundedParams, root: Randomness, round_index: int
                            ) -> dict[str, torch.Tensor]:
    """Each user's weighted clipped delta as one round of training computes it: the mechanism's own
    filtering, weights and per-(round, user) batch streams."""
    kept = UeDpBounded(params, root).select(data).data
    theta = parameters_to_vector(_model().parameters()).detach().clone()
    trainer = LocalTrainer(_model(), causal_lm_loss, CPU, kept.pad_id, params.clip, params.local_steps,
                           params.local_batch_size, params.local_lr)
    weights = user_weights(kept, params.weight_cap)
    return {user: trainer.clipped_sum(theta, [seqs], [float(w)], [root.stream("local-batches", round_index, user)])
            for (user, seqs), w in zip(kept.by_user.items(), weights)}


@pytest.mark.parametrize("k", [1, 2])
def test_changing_a_user_and_an_entity_moves_at_most_1_plus_k_users_each_by_at_most_2_beta(k: int) -> None:
    clip = 0.05
    params = UeDpBoundedParams(holders_per_entity=k, rounds=1, q_user=1.0, noise_multiplier=1.0, clip=clip,
                               local_steps=3, local_batch_size=2, local_lr=0.5, weight_cap=2.0)
    d, d_prime, _ = _adjacent_pair(k)
    root = Randomness.secure()
    a = _per_user_contributions(d, params, root, 1)
    b = _per_user_contributions(d_prime, params, root, 1)
    moved = {u: float(torch.linalg.vector_norm(a[u] - b[u])) for u in a}
    changed = [u for u, m in moved.items() if m > 0]
    assert "u7" in changed and len(changed) == 1 + k
    assert max(moved.values()) <= 2 * clip * (1 + 1e-5)
    total = float(torch.linalg.vector_norm(sum(a.values()) - sum(b.values())))  # type: ignore[arg-type]
    assert total <= 2 * clip * (1 + k) * (1 + 1e-5)
    # Without the holder bound (userdp on every sentence) the same change reaches every user of SHARED.
    unbounded = UeDpBoundedParams(holders_per_entity=SPREAD, rounds=1, q_user=1.0, noise_multiplier=1.0, clip=clip,
                                  local_steps=3, local_batch_size=2, local_lr=0.5, weight_cap=2.0)
    a, b = (_per_user_contributions(x, unbounded, root, 1) for x in (d, d_prime))
    assert sum(1 for u in a if not torch.equal(a[u], b[u])) == 1 + SPREAD > 1 + k


def test_a_real_noiseless_round_moves_the_model_by_at_most_2_beta_1_plus_k_over_the_denominator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The mechanism's own train(): every user sampled (q = 1), the noise switched off in the module, one
    round on D and on D' from the same weights and the same secret root. The per-user test above has the
    teeth on which users move; this one checks that nothing else in the real path (filtering, weights,
    the denominator) moves the released model further."""
    k, clip = 1, 0.05
    def no_noise(tensors, std, source):  # type: ignore[no-untyped-def]
        done: Future[list[torch.Tensor]] = Future()
        done.set_result([torch.zeros_like(t) for t in tensors])
        return done

    monkeypatch.setattr(userdp_module, "noise_ahead", no_noise)
    params = UeDpBoundedParams(holders_per_entity=k, rounds=1, q_user=1.0, noise_multiplier=1.0, clip=clip,
                               local_steps=2, local_batch_size=2, local_lr=0.5)
    d, d_prime, _ = _adjacent_pair(k)
    root = Randomness.seeded(11)
    models = []
    for data in (d, d_prime):
        model = _model()
        statement = UeDpBounded(params, root).train(model, data, causal_lm_loss, CPU, lambda r: None).statement
        models.append(parameters_to_vector(model.parameters()).detach())
    denominator = statement.extra["denominator"]
    assert denominator == pytest.approx(1.0 * 8)  # q_user * N, N public under substitution
    moved = float(torch.linalg.vector_norm(models[0] - models[1])) * denominator
    assert 0 < moved <= 2 * clip * (1 + k) * (1 + 1e-4)


def test_texts_changed_with_the_graph_fixed_keep_the_same_sentences() -> None:
    d, d_prime, _ = _adjacent_pair(2)
    params = UeDpBoundedParams(holders_per_entity=2, noise_multiplier=1.0)
    a, b = (UeDpBounded(params).select(x).data for x in (d, d_prime))
    assert {u: len(s) for u, s in a.by_user.items()} == {u: len(s) for u, s in b.by_user.items()}
    kept = UeDpBounded(params).select(d).sampling
    assert isinstance(kept, KeptHolders)
    kept_positions = kept.choice.kept
    assert bounded_training_data(d_prime, kept.graph, kept.choice).entities == b.entities
    with pytest.raises(ValueError, match="another dataset"):
        bounded_training_data(TrainData({"other": d.by_user["u0"]}, d.pad_id, {"other": d.entities["u0"]}),  # type: ignore[index]
                              kept.graph, kept.choice)
    assert sum(map(sum, kept_positions)) == sum(len(s) for s in a.by_user.values())


def test_the_statement_names_k_the_share_kept_and_the_public_graph() -> None:
    d, _, _ = _adjacent_pair(1)
    params = UeDpBoundedParams(holders_per_entity=1, rounds=1, q_user=0.5, noise_multiplier=2.0, local_steps=1)
    statement = UeDpBounded(params, Randomness.secure()).train(_model(), d, causal_lm_loss, CPU, lambda r: None).statement
    assert "substitution" in statement.unit and "attribution graph public" in statement.unit
    graph_line = next(line for line in statement.public if "attribution graph" in line)
    assert "k = 1 holders per entity" in graph_line and "sentences with an entity" in graph_line
    assert statement.extra["holders_per_entity"] == 1 and statement.extra["group_size"] == 2
    assert 0 < statement.extra["sensitive_share_kept"] < 1
    assert statement.epsilon == pytest.approx(epsilon_after(group_replace_round(0.5, 2.0, 2), 1, 1e-5, "pld",
                                                            "replace"))


# --- accounting ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("group", [1, 2, 5])
def test_the_group_round_equals_dp_accountings_replace_one_releases_composed_directly(group: int) -> None:
    q, z, rounds, delta = 0.05, 3.0, 40, 1e-5
    direct = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    direct.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z / math.sqrt(group))),
                   rounds * group)
    expected = direct.get_epsilon(delta)
    assert epsilon_after(group_replace_round(q, z, group), rounds, delta, "pld", "replace") == pytest.approx(
        expected, rel=1e-6)
    ledger = RoundAccountant(group_replace_round(q, z, group), delta, "pld", "replace")
    schedule = ledger.schedule_for(rounds)
    for _ in range(rounds):
        ledger.spend()
    assert ledger.epsilon == schedule.shown[rounds] == pytest.approx(expected, rel=1e-6)


def _exact_group_delta(epsilon: float, q: float, z: float, group: int) -> float:
    """The one-round hockey-stick divergence of the group's worst case in one dimension, by quadrature:
    each of ``group`` members sampled with probability q moves from -1 to +1 (clip units), noise std z:
    P = sum_j Binom(g, q)(j) N(-j, z^2), Q = the same at +j (both directions are equal by symmetry)."""
    weights = stats.binom.pmf(np.arange(group + 1), group, q)

    def gap(x: float) -> float:
        p = float(np.dot(weights, stats.norm.pdf(x, -np.arange(group + 1), z)))
        r = float(np.dot(weights, stats.norm.pdf(x, np.arange(group + 1), z)))
        return max(0.0, p - math.exp(epsilon) * r)

    lo, hi = -group - 12 * z, group + 12 * z
    value, _ = integrate.quad(gap, lo, hi, limit=400, points=[0.0])
    return float(value)


@pytest.mark.parametrize(("q", "z", "group"), [(0.05, 1.0, 2), (0.1, 2.0, 5), (0.3, 3.0, 5), (1.0, 2.0, 3)])
def test_the_conservative_group_bound_dominates_the_exact_one_round_curve(q: float, z: float, group: int) -> None:
    """Our derivation checked independently: at every epsilon the bound's delta is at least the exact
    one-round delta of the worst case (and equal for q = 1, where it is one Gaussian of sensitivity 2g);
    treating the group as one user (no group at all) falls below the exact curve, so the check can fail."""
    bound = round_accounting._round_pld(group_replace_round(q, z, group), "replace")
    single = round_accounting._round_pld(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)),
                                   "replace")
    undercounted = False
    for epsilon in (0.1, 0.5, 1.0, 2.0, 4.0):
        exact = _exact_group_delta(epsilon, q, z, group)
        assert bound.get_delta_for_epsilon(epsilon) >= exact - 1e-6  # type: ignore[attr-defined]
        if q == 1.0:
            assert bound.get_delta_for_epsilon(epsilon) == pytest.approx(exact, abs=2e-3)  # type: ignore[attr-defined]
        undercounted |= single.get_delta_for_epsilon(epsilon) < exact - 1e-4  # type: ignore[attr-defined]
    assert undercounted


@pytest.mark.parametrize(("k", "target"), [(1, 4.0), (4, 8.0)])
def test_calibration_meets_the_target_within_one_percent(k: int, target: float) -> None:
    params = UeDpBoundedParams(holders_per_entity=k, q_user=0.05, rounds=30, target_epsilon=target)
    mechanism = UeDpBounded(params)
    epsilon = mechanism.epsilon()
    assert target * 0.99 <= epsilon <= target
    assert mechanism.noise_multiplier >= events.MIN_NOISE_MULTIPLIER * math.sqrt(1 + k)


def test_the_rdp_accountant_is_refused_for_substitution() -> None:
    with pytest.raises(ValueError, match="only the pld accountant"):
        UeDpBoundedParams(accountant="rdp", noise_multiplier=1.0)


# --- planner and sweep -------------------------------------------------------------------------------------


def test_the_planner_states_k_the_group_and_no_dp_count() -> None:
    result = CliRunner().invoke(app, ["epsilon", "--mechanism", "uedp-bounded", "--users", "946", "--q-user", "0.05",
                                      "--rounds", "20", "--noise-multiplier", "3", "--holders-per-entity", "4"])
    assert result.exit_code == 0, result.output
    expected = epsilon_after(group_replace_round(0.05, 3.0, 5), 20, 1e-5, "pld", "replace")
    assert f"epsilon = {expected:.4g}" in result.output
    assert "k = 4 holders per entity" in result.output and "1 + k = 5" in result.output
    assert "DP count" not in result.output


def test_a_sweep_grid_runs_each_point_under_its_own_label(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = SweepConfig(home=str(tmp_path), dataset="d", mechanisms=["userdp", "uedp-bounded"], target_epsilons=[8.0],
                         grid={"holders_per_entity": [1, 4]})
    items = config.items()
    assert [i.config.label for i in items] == ["userdp", "uedp-bounded-k1", "uedp-bounded-k4"]
    assert len({i.config.run_name() for i in items}) == 3
    # Any other axis names itself; an axis given by another of a parameter's names still applies.
    config = SweepConfig(home=str(tmp_path), dataset="d", mechanisms=["userdp", "uedp-bounded"],
                         grid={"q_user": [0.05, 0.1], "steps": [3]})
    items = config.items()
    labels = [i.config.label for i in items]
    assert len(set(labels)) == len(labels) == 4 and "userdp-q_user=0.1-steps=3" in labels
    assert {i.config.params.rounds for i in items} == {3}  # type: ignore[attr-defined]
    assert len({i.config.fingerprint() for i in items}) == 4  # each point its own checkpoint
    with pytest.raises(ValueError, match="not a mechanism parameter"):
        SweepConfig(home=str(tmp_path), dataset="d", grid={"holders": [1]})
