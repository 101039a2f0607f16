"""Private models that learn, and a tool that says so: the planner's noise-to-signal and its warning, the
divergence stop, and uedp-bounded's k chosen by ``auto``. Real mechanisms, real accountants, real runs."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest
import torch
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from uedp.commands import app
from uedp.detection.pipeline import DetectorConfig
from uedp.flows.demo import DEMO_CORPUS
from uedp.models.metrics import causal_lm_loss
from uedp.privacy.accounting.events import epsilon_after, poisson_gaussian_round
from uedp.privacy.accounting.rounds import RoundAccountant
from uedp.privacy.accounting.worst_case import UeDpAccounting
from uedp.privacy.attribution import AttributionGraph, choose_holders
from uedp.privacy.mechanisms.auto_holders import CANDIDATES, FIXED_NOISE_K, choose_k
from uedp.privacy.mechanisms.base import TrainData
from uedp.privacy.mechanisms.checkpoint import Checkpointer
from uedp.privacy.mechanisms.divergence import NORM_GROWTH, PATIENCE, WARMUP, DivergenceWatch
from uedp.privacy.mechanisms.dpsgd import DpSgd, DpSgdParams
from uedp.privacy.mechanisms.loop import RoundLoop, RoundOutput
from uedp.privacy.mechanisms.noiseless import Noiseless
from uedp.privacy.mechanisms.params import NoiselessParams, UeDpBoundedParams, UeDpParams, UserDpParams
from uedp.privacy.mechanisms.uedp import UeDp
from uedp.privacy.mechanisms.uedp_bounded import UeDpBounded, dropped_entities_warning, resolve_auto
from uedp.privacy.mechanisms.userdp import UserDp
from uedp.privacy.population import Population
from uedp.privacy.randomness import Randomness
from uedp.privacy.signal import LEARNING_STOPS_PAST, NoiseToSignal
from uedp.services.config import TrainConfig
from uedp.services.detect import detect_entities
from uedp.services.training import train_configuration
from uedp.storage.formats.registry import user_fix
from uedp.storage.ingest import IngestOptions, ingest

from support import TOKENIZER, fedavg_data, tiny_gpt2

runner = CliRunner()


# --- the noise-to-signal of one averaged update -------------------------------------------------------------

def test_userdp_ratio_is_z_over_the_expected_users() -> None:
    mechanism = UserDp(UserDpParams(noise_multiplier=1.3, q_user=0.1, clip=0.7), Population.declared(500))
    signal = mechanism.noise_to_signal(500)
    assert signal.ratio == pytest.approx(1.3 / (0.1 * 500))
    assert signal.noise_std == pytest.approx(1.3 * 0.7) and signal.rule == "server-sgd"
    # the trainable coordinates (issue 65): the noise's norm over them, beside the signal's at most the clip
    assert signal.norm_ratio is None and "trainable coordinates" not in signal.line()  # not known: `uedp epsilon`
    full, lora = (replace(signal, coordinates=n) for n in (134_515_008, 460_800))
    assert full.norm_ratio == pytest.approx(signal.ratio * 134_515_008 ** 0.5)
    assert full.ratio == lora.ratio and full.norm_ratio / lora.norm_ratio == pytest.approx((134_515_008 / 460_800) ** 0.5)
    assert f"over its 460,800 trainable coordinates the noise's norm is about {lora.norm_ratio:.3g} times" in lora.line()


def test_uedp_bounded_ratio_uses_the_z_its_group_needs() -> None:
    for k in (1, 4):
        mechanism = UeDpBounded(UeDpBoundedParams(target_epsilon=4.0, q_user=0.1, rounds=10, holders_per_entity=k))
        assert mechanism.noise_to_signal(300).ratio == pytest.approx(mechanism.noise_multiplier / 30)
    small, large = (UeDpBounded(UeDpBoundedParams(target_epsilon=4.0, q_user=0.1, rounds=10, holders_per_entity=k))
                    for k in (1, 4))
    assert large.noise_to_signal(300).ratio > small.noise_to_signal(300).ratio  # more holders, more noise


def test_uedp_ratio_carries_its_2m_plus_1_sensitivity() -> None:
    population = Population.declared(900)
    mechanism = UeDp(UeDpParams(noise_multiplier=1.0, q_user=0.05, rounds=20), population)
    factor = mechanism.accounting.sensitivity_factor
    assert isinstance(mechanism.accounting, UeDpAccounting) and factor > 1
    assert mechanism.noise_to_signal(900).ratio == pytest.approx(factor / (0.05 * 900))


def test_dpsgd_ratio_is_z_over_the_expected_batch() -> None:
    mechanism = DpSgd(DpSgdParams(noise_multiplier=2.0, batch_size=32), Population.declared(10_000))
    signal = mechanism.noise_to_signal(10_000)
    assert signal.ratio == pytest.approx(2.0 / 32) and signal.rule == "adam"


def test_the_warning_fires_past_the_threshold_only_and_names_the_fixes() -> None:
    limit = LEARNING_STOPS_PAST["server-sgd"]
    below = NoiseToSignal("userdp", noise_std=0.9 * limit * 100, clip=1.0, units=100, rule="server-sgd")
    above = NoiseToSignal("userdp", noise_std=1.1 * limit * 100, clip=1.0, units=100, rule="server-sgd")
    assert below.warning() is None and not below.past_limit
    warning = above.warning()
    assert warning is not None and above.past_limit
    for fix in ("more users (a corpus with more writers)", "--q-user", "fewer --rounds", "--target-epsilon", "--init-from"):
        assert fix in warning
    assert "chunk:N" not in warning  # without a dataset, no option of a format it may not have
    assert "more users (ingest again with --users chunk:N" in (above.warning(user_fix("ag_news")) or "")
    assert "more users (each filer (CIK) is one user" in (above.warning(user_fix("sec")) or "")
    fixed = NoiseToSignal("userdp", 1.1 * limit * 100, 1.0, 100, "server-sgd", fixed_noise=True).warning() or ""
    assert "a smaller --noise-multiplier" in fixed and "--target-epsilon" not in fixed
    started = above.warning(pretrained=True) or ""  # a run that starts from a model is not told to (issue 68, 7)
    assert "--init-from" not in started and "--q-user" in started


def test_a_planned_run_from_a_model_is_not_told_to_start_from_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    from uedp.services.training_plan import PublicFacts, plan_training

    folder = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(TOKENIZER), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(folder)
    swamped = dict(dataset="d", q_user=0.05, rounds=40, noise_multiplier=4.0)
    facts = PublicFacts(Population.declared(946), train_users=946)
    scratch = TrainConfig.for_mechanism("userdp", **swamped)
    from_model = TrainConfig.for_mechanism("userdp", model="causal-lm", model_size=str(folder), **swamped)
    assert not scratch.starts_from_a_model and from_model.starts_from_a_model
    told = [plan_training(config, facts).noise_warning or "" for config in (scratch, from_model)]
    assert "is unlikely to learn" in told[0] and "is unlikely to learn" in told[1]
    assert "--init-from" in told[0] and "--init-from" not in told[1]


def _printed_ratio(output: str) -> float:
    return float(re.search(r"noise-to-signal ([0-9.e+-]+):", output).group(1))  # type: ignore[union-attr]


def test_the_planner_prints_the_ratio_and_warns_when_it_is_past_where_runs_stop_learning() -> None:
    common = ["--users", "946", "--q-user", "0.05", "--rounds", "40", "--target-epsilon"]
    learns = runner.invoke(app, ["epsilon", "--mechanism", "userdp", *common, "8"])
    assert learns.exit_code == 0, learns.output
    z = float(re.search(r"z = ([0-9.]+)", learns.output).group(1))  # type: ignore[union-attr]
    assert _printed_ratio(learns.output) == pytest.approx(z / (0.05 * 946), rel=5e-3)  # printed to 3 digits
    assert "warning" not in learns.output
    swamped = runner.invoke(app, ["epsilon", "--mechanism", "uedp-bounded", *common, "2", "--holders-per-entity", "4"])
    assert swamped.exit_code == 0, swamped.output
    assert _printed_ratio(swamped.output) > LEARNING_STOPS_PAST["server-sgd"]
    assert "is unlikely to learn" in swamped.output and "--holders-per-entity" in swamped.output


# --- the divergence stop --------------------------------------------------------------------------------------

def test_a_non_finite_figure_stops_at_once_and_growth_only_after_patience() -> None:
    watch = DivergenceWatch()
    watch.start(1.0)
    assert watch.check(1, weights=1.1, update=0.5) is None
    assert "became nan" in (watch.check(2, weights=math.nan) or "")
    grow = DivergenceWatch("step")
    grow.start(1.0)
    reasons = [grow.check(r, weights=NORM_GROWTH * 2) for r in range(1, PATIENCE + 1)]
    assert reasons[:-1] == [None] * (PATIENCE - 1) and "grew from 1 to" in (reasons[-1] or "")
    spiky = DivergenceWatch()
    spiky.start(1.0)
    figures = [NORM_GROWTH * 2, 1.0] * 5  # one round past the factor at a time is noise, not divergence
    assert all(spiky.check(r, weights=w) is None for r, w in enumerate(figures, 1))


def test_the_loss_reference_is_the_median_of_the_first_rounds_not_one_easy_batch() -> None:
    watch = DivergenceWatch("step")
    watch.start(1.0)
    losses = [0.5, 3.0, 3.1, 2.9, 3.0] + [3.2] * 10  # an easy first batch, then ordinary ones
    assert all(watch.check(r, weights=1.0, loss=v) is None for r, v in enumerate(losses, 1))
    assert watch.reference("loss") == 3.0
    exploding = [watch.check(16 + r, weights=1.0, loss=10.0) for r in range(PATIENCE)]
    assert exploding[-1] is not None and "training loss grew from 3" in exploding[-1]


def test_strikes_are_counted_per_figure() -> None:
    watch = DivergenceWatch()
    watch.start(1.0)
    for r in range(1, WARMUP + 1):
        watch.check(r, weights=1.0, update=1.0)
    # the weights and the update take turns past their factor: neither is past it three rounds in a row
    turns = [(NORM_GROWTH * 2, 1.0), (1.0, NORM_GROWTH * 2)] * 3
    assert all(watch.check(10 + r, weights=w, update=u) is None for r, (w, u) in enumerate(turns))


class _Growing(torch.nn.Module):
    """A one-weight model a round multiplies by 10: past 50x its start after two rounds."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))


def _growing_loop(checkpoint, crash_at: int | None = None) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    model = _Growing()
    ledger = RoundAccountant(poisson_gaussian_round(0.5, 1.0), 1e-5)
    loop = RoundLoop("growing", 20, ledger, Randomness.seeded(0), 1e-5, state={"model": model})

    def body(round_index: int, _: object) -> RoundOutput:
        if round_index == crash_at:
            raise RuntimeError("crash")
        with torch.no_grad():
            model.weight.mul_(10.0)
        return RoundOutput()

    outcome = loop.run(body, lambda report: None, checkpoint)
    return outcome.rounds, outcome.stopped


def test_a_resumed_run_keeps_the_weights_reference_of_its_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    uninterrupted = _growing_loop(Checkpointer(tmp_path / "a", 1, "a"))
    assert uninterrupted[0] == 4 and "grew from" in uninterrupted[1]  # 100x at round 2: strikes 2, 3, 4
    folder = Checkpointer(tmp_path / "b", 1, "b")
    with pytest.raises(RuntimeError):
        _growing_loop(folder, crash_at=3)
    # Judged from where it resumed (100x larger), it would run on past round 4.
    assert _growing_loop(Checkpointer(tmp_path / "b", 1, "b")) == uninterrupted


def test_a_diverging_userdp_run_stops_says_so_and_states_the_planned_epsilon() -> None:
    torch.manual_seed(0)
    params = UserDpParams(noise_multiplier=1.0, q_user=0.5, rounds=30, local_steps=1, server_lr=1e6)
    statement = UserDp(params, Population.declared(12), Randomness.seeded(3)).train(
        tiny_gpt2(), fedavg_data(), causal_lm_loss, torch.device("cpu"), lambda report: None).statement
    assert statement.rounds < 30
    assert f"stopped after round {statement.rounds} of 30: the run diverged" in statement.notes
    # the stopping round was read from released figures: the guarantee is the planned run's, not the rounds run
    planned = epsilon_after(poisson_gaussian_round(0.5, 1.0), 30, params.delta, "pld",
                            initial=Population.declared(12).event())
    assert statement.epsilon == pytest.approx(planned, rel=1e-9)


def test_a_noiseless_run_whose_loss_explodes_stops() -> None:
    data = TrainData({"u": [TOKENIZER("short sentence " * 4, return_tensors="pt")["input_ids"][0]] * 8},
                     TOKENIZER.pad_token_id)
    reports: list[float] = []
    statement = Noiseless(NoiselessParams(steps=60, batch_size=4, lr=50.0), seed=0).train(
        tiny_gpt2(), data, causal_lm_loss, torch.device("cpu"), lambda r: reports.append(r.loss)).statement
    assert statement.rounds < 60 and "the run diverged" in statement.notes
    assert len(reports) == statement.rounds


def test_a_run_that_learns_is_not_stopped() -> None:
    params = UserDpParams(noise_multiplier=0.5, q_user=0.5, rounds=8, local_steps=2)
    statement = UserDp(params, Population.declared(12), Randomness.seeded(1)).train(
        tiny_gpt2(), fedavg_data(), causal_lm_loss, torch.device("cpu"), lambda report: None).statement
    assert statement.rounds == 8 and "diverged" not in statement.notes


# --- uedp-bounded's k chosen by auto ----------------------------------------------------------------------------

def _graph(users: int = 12) -> AttributionGraph:
    """Entity e_j is mentioned by users j..j+5 (mod users): more holders keep more sentences."""
    sets = {f"u{u}": [frozenset({f"e{j}"}) for j in range(users) if (u - j) % users < 6] + [frozenset()]
            for u in range(users)}
    return AttributionGraph.from_entity_sets(sets)


def _ratios(per_k: dict[int, float]):  # type: ignore[no-untyped-def]
    def signal_for(k: int) -> NoiseToSignal:
        return NoiseToSignal("uedp-bounded", per_k[k] * 10, 1.0, 10.0, "server-sgd")
    return signal_for


def test_auto_takes_the_largest_k_within_the_threshold_and_says_what_the_next_would_cost() -> None:
    limit = LEARNING_STOPS_PAST["server-sgd"]
    per_k = {0: limit / 4, 1: limit / 2, 2: limit * 0.9, 4: limit * 1.5, 8: limit * 3, 16: limit * 6}
    chosen = choose_k(_graph(), _ratios(per_k))
    assert chosen.k == 2
    assert [c.k for c in chosen.candidates] == [0, 1, 2, 4]  # stops at the first k past the threshold
    assert "k = 2 chosen by auto: keeps, of the" in chosen.reason and "k = 4 would keep" in chosen.reason
    kept = [c.kept for c in chosen.candidates]
    assert kept == sorted(kept) and kept[0] == 0


def test_auto_takes_the_least_noise_when_every_k_is_past_the_threshold() -> None:
    limit = LEARNING_STOPS_PAST["server-sgd"]
    chosen = choose_k(_graph(), _ratios({k: limit * (2 + k) for k in CANDIDATES}))
    assert chosen.k == 0 and "least noise" in chosen.reason
    # not a silent k = 0 (issue 68, 6): what it means, what would let a larger k learn, and how to choose one
    assert "At k = 0 no sentence that names an entity trains" in chosen.reason
    for fix in ("a larger --q-user", "a larger --target-epsilon", "--lora-rank", "--holders-per-entity K"):
        assert fix in chosen.reason, fix


def _entity_sets(users: int = 12) -> dict[str, list[frozenset[str]]]:
    return {f"u{u}": [frozenset({f"e{j}"}) for j in range(users) if (u - j) % users < 6] + [frozenset()]
            for u in range(users)}


def test_a_k_that_drops_most_entity_text_is_warned_with_the_trade_off() -> None:
    """Issue 50 item 8: auto chose k = 0 and kept none of the sentences with an entity, said only in the statement."""
    limit = LEARNING_STOPS_PAST["server-sgd"]
    graph = AttributionGraph.from_entity_sets(_entity_sets())
    chosen = choose_k(graph, _ratios({0: limit * 0.5, 1: limit * 1.4, 2: limit * 2, 4: limit * 3, 8: 1, 16: 1}))
    assert chosen.k == 0 and "k = 1 would keep 17% at" in chosen.reason  # "would keeps" before
    params = UeDpBoundedParams(holders_per_entity=0, noise_multiplier=1.0, q_user=0.5, rounds=2)
    warning = dropped_entities_warning(UeDpBounded(params, chosen=chosen), _entity_sets())
    assert warning == ("uedp-bounded (k = 0) trains on 0 of the 72 sentences that name an entity (0%): the model "
                       f"learns no entity text. Trade-off: k = 1 would keep 17% at noise-to-signal {limit * 1.4:.3g} "
                       f"(past {limit:g}, where measured runs stopped learning); userdp keeps every sentence and "
                       "protects users only")
    by_hand = dropped_entities_warning(UeDpBounded(params.model_copy(update={"holders_per_entity": 2})), _entity_sets())
    assert by_hand is not None and "(k = 2) trains on 24 of the 72" in by_hand and "a larger --holders-per-entity" in by_hand
    assert dropped_entities_warning(UeDpBounded(params.model_copy(update={"holders_per_entity": 4})), _entity_sets()) is None


def test_auto_stops_growing_k_once_every_sentence_is_kept() -> None:
    chosen = choose_k(_graph(), _ratios({k: 1e-4 for k in CANDIDATES}))
    assert chosen.k == 8 and chosen.candidates[-1].kept == _graph().n_sensitive  # 6 users per entity: k = 8 keeps all
    assert "keeps nothing more" in chosen.reason


def test_auto_with_a_real_calibration_depends_on_the_graph_only() -> None:
    sets = {f"u{u}": [frozenset({f"e{j}"}) for j in range(40) if (u - j) % 40 < 5] + [frozenset()]
            for u in range(40)}
    keys = sorted({key for sentences in sets.values() for entities in sentences for key in entities})
    reversed_names = {key: f"n{len(keys) - i:03d}" for i, key in enumerate(keys)}  # the sort order reversed
    renamed = {user: [frozenset(reversed_names[key] for key in entities) for entities in sentences]
               for user, sentences in sets.items()}
    params = UeDpBoundedParams(target_epsilon=8.0, q_user=0.5, rounds=5)
    first, second = resolve_auto(params, sets), resolve_auto(params, renamed)
    assert first.params.holders_per_entity == second.params.holders_per_entity
    assert first.chosen is not None and first.chosen.reason == second.chosen.reason  # type: ignore[union-attr]
    chosen = first.chosen
    picked = next(c for c in chosen.candidates if c.k == chosen.k)
    assert picked.signal.ratio == pytest.approx(first.noise_to_signal(40).ratio)
    assert first.epsilon() == pytest.approx(8.0, rel=0.01)


def test_training_reuses_the_holder_choice_auto_made(monkeypatch: pytest.MonkeyPatch) -> None:
    sets = {f"u{u}": [frozenset({f"e{j}"}) for j in range(40) if (u - j) % 40 < 5] + [frozenset()]
            for u in range(40)}
    mechanism = resolve_auto(UeDpBoundedParams(target_epsilon=8.0, q_user=0.5, rounds=5), sets)
    graph = AttributionGraph.from_entity_sets(sets)
    assert mechanism.chosen is not None and mechanism.chosen.choice_on(graph) is not None
    expected = choose_holders(graph, mechanism.k, "best")

    def made_again(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the holder choice auto made was made again")

    monkeypatch.setattr("uedp.privacy.mechanisms.uedp_bounded.choose_holders", made_again)
    data = TrainData({u: [TOKENIZER("x", return_tensors="pt")["input_ids"][0]] * len(e) for u, e in sets.items()},
                     TOKENIZER.pad_token_id, sets)
    selection = mechanism.select(data)
    assert selection.extra["sensitive_sentences_kept"] == expected.sensitive_kept
    other = {u: [frozenset({"z"}) if e else e for e in sentences] for u, sentences in sets.items()}  # another graph
    assert mechanism.chosen.choice_on(AttributionGraph.from_entity_sets(other)) is None


def test_auto_with_a_fixed_noise_multiplier_keeps_k_4_and_says_why() -> None:
    mechanism = UeDpBounded(UeDpBoundedParams(noise_multiplier=1.0))
    assert mechanism.params.holders_per_entity == FIXED_NOISE_K and mechanism.chosen is not None
    assert "only for a target epsilon" in mechanism.chosen.reason


@pytest.mark.slow
def test_training_says_the_ratio_first_logs_it_and_states_the_auto_choice(home, capsys) -> None:  # type: ignore[no-untyped-def]
    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    config = TrainConfig(dataset="demo", mechanism="uedp-bounded", target_epsilon=8.0, rounds=2, q_user=0.5,
                         local_steps=1, threads=1, checkpoint_every=0, categories=["PERSON", "LOC", "ORG"])
    result = train_configuration(home, config, progress=False)
    lines = [line for line in capsys.readouterr().err.splitlines() if " INFO " not in line]  # MLflow's own logs
    assert lines[0].startswith(f"{config.run_name()}: noise-to-signal")  # said before anything else of uedp's
    said = "\n".join(lines)
    run = MlflowClient(tracking_uri=home.mlflow_tracking_uri).get_run(result.run_id)
    logged = float(run.data.params["noise_to_signal"])
    assert logged == pytest.approx(_printed_ratio(said), rel=1e-2)
    trainable = int(run.data.params["trainable_parameters"])  # the model's, as the run logs them
    assert f"over its {trainable:,} trainable coordinates the noise's norm is about" in lines[0]
    assert any("chosen by auto" in line for line in result.public)
    assert run.data.params["holders_per_entity"] == "auto"
    assert run.data.params["privacy_holders_per_entity"] in {str(float(k)) for k in CANDIDATES}


@pytest.mark.parametrize("bad", ["lots", "-1", -1, True, 2.5])
def test_a_bad_k_is_refused_with_one_message_naming_the_setting(bad: object) -> None:
    result = runner.invoke(app, ["epsilon", "--mechanism", "uedp-bounded", "--users", "100", "--set",
                                 f"holders_per_entity={str(bad).lower() if isinstance(bad, bool) else bad}"])
    assert result.exit_code == 2
    assert "invalid holders_per_entity: k is a whole number >= 0, or auto" in result.stderr
    assert UeDpBoundedParams(holders_per_entity="3").holders_per_entity == 3  # as the CLI and --set give it
