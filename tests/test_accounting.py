"""Accounting comes from dp_accounting, agrees with it, matches published values and calibrates; a run's
epsilon schedule is planned before its first round, exact at every shown round and at the budget stop."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import dp_accounting
import pytest
from dp_accounting import pld, rdp

from uedp.privacy.accounting import memo
from uedp.privacy.accounting import rounds as round_accounting
from uedp.privacy.accounting.calibration import calibrate_noise_multiplier, check_delta
from uedp.privacy.accounting.events import epsilon_after, poisson_gaussian_round
from uedp.privacy.accounting.rounds import FIRST_SHOWN, SHOWN_ROUNDS, RoundAccountant, shown_rounds
from uedp.privacy.mechanisms.base import RoundReport
from uedp.privacy.mechanisms.checkpoint import Checkpointer
from uedp.privacy.mechanisms.loop import NoAccountant, RoundLoop, RoundOutput, WorstCaseAccountant
from uedp.privacy.randomness import Randomness, RoundRandomness


def test_round_accountant_equals_dp_accounting_directly() -> None:
    event = poisson_gaussian_round(0.1, 1.1)
    accountant = RoundAccountant(event, 1e-5, "rdp")
    accountant.schedule_for(20)
    for _ in range(20):
        accountant.spend()
    direct = rdp.RdpAccountant()
    direct.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.1)), 20)
    assert accountant.epsilon == pytest.approx(direct.get_epsilon(1e-5), rel=1e-12)
    assert accountant.rounds == 20
    pld_direct = pld.PLDAccountant()
    pld_direct.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.1)), 20)
    assert epsilon_after(event, 20, 1e-5, "pld") == pytest.approx(pld_direct.get_epsilon(1e-5), rel=1e-9)


def test_spend_hands_on_the_planned_figure_of_a_shown_round() -> None:
    accountant = RoundAccountant(poisson_gaussian_round(0.2, 1.0), 1e-5, "rdp")
    schedule = accountant.schedule_for(3)
    assert accountant.rounds == 0 and accountant.epsilon == 0.0
    assert accountant.spend() == schedule.shown[1] == epsilon_after(poisson_gaussian_round(0.2, 1.0), 1, 1e-5, "rdp")
    assert accountant.rounds == 1 and accountant.epsilon == schedule.shown[1]


def test_epsilon_grows_with_rounds() -> None:
    accountant = RoundAccountant(poisson_gaussian_round(0.2, 1.0), 1e-5, "rdp")
    values = list(accountant.schedule_for(5).shown.values())
    assert values == sorted(values) and values[0] > 0


def test_abadi_et_al_published_setting() -> None:
    """q=0.01, z=4, T=10000, delta=1e-5: the moments accountant gives ~1.26; RDP and PLD are tighter."""
    event = poisson_gaussian_round(0.01, 4.0)
    eps_rdp = epsilon_after(event, 10_000, 1e-5, "rdp")
    eps_pld = epsilon_after(event, 10_000, 1e-5, "pld")
    assert 0.9 < eps_rdp < 1.26
    assert 0.8 < eps_pld < eps_rdp


@pytest.mark.parametrize("kind", ["rdp", "pld"])
@pytest.mark.parametrize("target", [1.0, 8.0])
def test_calibration_is_below_target_and_within_one_percent(kind: str, target: float) -> None:
    z = calibrate_noise_multiplier(lambda noise: poisson_gaussian_round(0.05, noise), 100, target, 1e-5, kind)  # type: ignore[arg-type]
    achieved = epsilon_after(poisson_gaussian_round(0.05, z), 100, 1e-5, kind)  # type: ignore[arg-type]
    assert achieved <= target
    assert achieved >= 0.99 * target


def test_unreachable_calibration_is_an_error_not_a_silent_tiny_noise() -> None:
    with pytest.raises(ValueError, match="met even with noise multiplier"):
        calibrate_noise_multiplier(lambda noise: poisson_gaussian_round(0.01, noise), 1, 1e6, 1e-5, "rdp")


def test_delta_must_be_below_one_over_units() -> None:
    assert check_delta(1e-5, 1000) is None
    with pytest.warns(UserWarning, match="not below 1/40"):
        assert check_delta(0.05, 40) is not None


@pytest.mark.parametrize("kind", ["pld", "rdp"])
def test_a_dp_count_is_composed_once_before_the_rounds_as_dp_accounting_composes_it(kind: str) -> None:
    """The DP count of units (a Gaussian of sensitivity 1) is released once; per-round epsilon includes it."""
    event, count = poisson_gaussian_round(0.05, 1.0), dp_accounting.GaussianDpEvent(10.0)
    accountant = RoundAccountant(event, 1e-5, kind, initial=count)
    direct = pld.PLDAccountant() if kind == "pld" else rdp.RdpAccountant()
    direct.compose(count)
    assert accountant.epsilon == pytest.approx(direct.get_epsilon(1e-5), rel=1e-3)  # spent before round 1
    accountant.schedule_for(30)
    for _ in range(30):
        accountant.spend()
    direct.compose(event, 30)
    assert accountant.epsilon == pytest.approx(direct.get_epsilon(1e-5), rel=1e-3)
    assert accountant.epsilon > epsilon_after(event, 30, 1e-5, kind)
    restored = RoundAccountant(event, 1e-5, kind, initial=count)
    restored.load_state_dict(accountant.state_dict())
    assert restored.rounds == 30 and restored.epsilon == pytest.approx(accountant.epsilon, rel=1e-9)
    with pytest.raises(ValueError, match="another mechanism"):
        RoundAccountant(event, 1e-5, kind).load_state_dict(accountant.state_dict())  # without the count


def test_calibration_counts_the_dp_count_and_refuses_a_target_it_alone_spends() -> None:
    count = dp_accounting.GaussianDpEvent(10.0)
    z = calibrate_noise_multiplier(lambda noise: poisson_gaussian_round(0.1, noise), 50, 3.0, 1e-5, "rdp", initial=count)
    achieved = epsilon_after(poisson_gaussian_round(0.1, z), 50, 1e-5, "rdp", initial=count)
    assert 0.99 * 3.0 <= achieved <= 3.0
    with pytest.raises(ValueError, match="spent by the DP count"):
        calibrate_noise_multiplier(lambda noise: poisson_gaussian_round(0.1, noise), 50, 0.2, 1e-5, "rdp",
                                   initial=dp_accounting.GaussianDpEvent(5.0))


# --- the schedule: planned before round 1, every shown figure exact, the budget stop exact ---------------

SHOWN_EVENT = poisson_gaussian_round(0.1, 2.0)
COUNT = dp_accounting.GaussianDpEvent(10.0)  # a DP count of the units, released once before round 1


def _exact(rounds: int, kind: str = "pld", with_count: bool = False) -> float:
    """dp_accounting's own figure, composed from scratch."""
    return epsilon_after(SHOWN_EVENT, rounds, 1e-5, kind, initial=COUNT if with_count else None)  # type: ignore[arg-type]


def _accountant(kind: str = "pld", with_count: bool = False) -> RoundAccountant:
    return RoundAccountant(SHOWN_EVENT, 1e-5, kind, initial=COUNT if with_count else None)  # type: ignore[arg-type]


@pytest.mark.parametrize("rounds", [0, 1, SHOWN_ROUNDS, SHOWN_ROUNDS + 1, 133, 1000, 10_007])
def test_a_short_run_shows_every_round_and_a_long_one_a_bounded_number_always_its_last(rounds: int) -> None:
    shown = shown_rounds(rounds)
    assert shown == sorted(set(shown)) and len(shown) <= SHOWN_ROUNDS and all(1 <= r <= rounds for r in shown)
    if rounds <= SHOWN_ROUNDS:
        assert shown == list(range(1, rounds + 1))
    else:
        assert shown[:FIRST_SHOWN] == list(range(1, FIRST_SHOWN + 1)) and shown[-1] == rounds
        assert len(shown) == SHOWN_ROUNDS
        gaps = {b - a for a, b in itertools.pairwise(shown[FIRST_SHOWN - 1:])}
        assert max(gaps) - min(gaps) <= 1  # evenly spaced, to the round


@pytest.mark.parametrize("with_count", [False, True])
@pytest.mark.parametrize("kind", ["pld", "rdp"])
def test_every_shown_epsilon_is_dp_accountings_for_its_round(kind: str, with_count: bool) -> None:
    rounds = 133  # the gaps between shown rounds take two lengths (129 rounds after the first 4, in 16 gaps)
    schedule = _accountant(kind, with_count).schedule_for(rounds)
    assert list(schedule.shown) == shown_rounds(rounds) and schedule.last == rounds and not schedule.stopped_by_budget
    shown = list(schedule.shown)
    # rdp is cheap: every figure; pld: the first rounds, every ninth one and the last two
    checked = shown if kind == "rdp" else sorted({*shown[:3], *shown[8::9], *shown[-2:]})
    for rounds_run in checked:
        assert schedule.shown[rounds_run] == pytest.approx(_exact(rounds_run, kind, with_count), rel=1e-7), rounds_run
    figures = list(schedule.shown.values())
    assert figures == sorted(figures) and figures[-1] == max(figures)


def _assert_exact_stop(last: int, budget: float, kind: str, with_count: bool) -> None:
    """The stop of a run under ``budget`` is exact: epsilon(last) <= budget < epsilon(last + 1)."""
    assert _exact(last, kind, with_count) <= budget, f"{last} rounds already exceed the budget"
    assert _exact(last + 1, kind, with_count) > budget, f"round {last + 1} would still have been within the budget"


@pytest.mark.parametrize(("kind", "with_count", "stop"), [
    ("pld", False, 78),  # between two shown rounds (77 and 80)
    ("pld", True, 78),
    ("pld", False, 77),  # on a shown round
    ("rdp", False, 78),
    ("rdp", True, 5),  # among the first rounds, all shown
    ("rdp", False, 0),  # not even round 1 fits
])
def test_the_budget_stop_is_the_last_round_within_the_budget(kind: str, with_count: bool, stop: int) -> None:
    rounds = 200
    budget = (_exact(stop, kind, with_count) + _exact(stop + 1, kind, with_count)) / 2
    if stop == 0:
        budget = _exact(1, kind, with_count) / 2
    schedule = _accountant(kind, with_count).schedule_for(rounds, budget)
    assert schedule.last == stop and schedule.stopped_by_budget
    _assert_exact_stop(schedule.last, budget, kind, with_count)
    for off_by_one in (schedule.last - 1, schedule.last + 1):  # the check catches a stop one round off
        if off_by_one >= 0:
            with pytest.raises(AssertionError):
                _assert_exact_stop(off_by_one, budget, kind, with_count)
    assert list(schedule.shown) == [r for r in shown_rounds(rounds) if r < stop] + ([stop] if stop else [])
    if stop:
        assert schedule.shown[stop] == pytest.approx(_exact(stop, kind, with_count), rel=1e-7)
        assert max(schedule.shown.values()) == schedule.shown[stop] <= budget


def test_a_budget_the_whole_run_stays_within_stops_nothing() -> None:
    schedule = _accountant("rdp").schedule_for(100, _exact(100, "rdp") * 1.0001)
    assert schedule.last == 100 and not schedule.stopped_by_budget and 100 in schedule.shown


def _count_accounting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count every call into dp_accounting's epsilon and composition (and the project's epsilon_after)."""
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    calls = [0]

    def counting(owner: object, name: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: object, **kwargs: object) -> object:
            calls[0] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    for owner, name in [(PrivacyLossDistribution, "compose"), (PrivacyLossDistribution, "self_compose"),
                        (PrivacyLossDistribution, "get_epsilon_for_delta"), (pld.PLDAccountant, "get_epsilon"),
                        (rdp.RdpAccountant, "get_epsilon"), (round_accounting, "epsilon_after")]:
        counting(owner, name)
    return calls


@pytest.mark.parametrize("kind", ["pld", "rdp"])
def test_the_loop_runs_to_the_planned_stop_and_does_no_accounting_between_rounds(
        kind: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rounds, stop = 203, 150
    budget = (_exact(stop, kind) + _exact(stop + 1, kind)) / 2
    ledger = _accountant(kind)
    calls = _count_accounting(monkeypatch)
    # Nothing remembered (privacy.accounting.memo): the plan must compute, for the counter to see it
    monkeypatch.setenv(memo.CACHE_ENV, str(tmp_path / "remembered"))
    memo.forget()
    during: list[int] = []  # the number of accounting calls, seen from inside the loop
    reports: list[RoundReport] = []

    def body(round_index: int, _: RoundRandomness) -> RoundOutput:
        during.append(calls[0])
        return RoundOutput()

    def on_round(report: RoundReport) -> None:
        reports.append(report)
        during.append(calls[0])

    loop = RoundLoop("accounting-test", rounds, ledger, Randomness.seeded(0), 1e-5, budget, state={})
    outcome = loop.run(body, on_round, Checkpointer(tmp_path, every=10, fingerprint="test"))  # saves: no accounting
    assert calls[0] > 0  # the counter sees accounting: the plan's, before round 1
    assert len(during) == 2 * stop and len(set(during)) == 1  # none from the first round to the last report
    assert outcome.rounds == len(reports) == stop and [r.round for r in reports] == list(range(1, stop + 1))
    assert outcome.stopped.startswith(f"stopped before round {stop + 1}: epsilon would exceed the budget")
    shown = [(r.round, r.epsilon) for r in reports if r.epsilon is not None]
    assert [r for r, _ in shown] == [r for r in shown_rounds(rounds) if r < stop] + [stop]
    curve = [epsilon for _, epsilon in shown]
    assert curve == sorted(curve) and max(curve) == curve[-1] == ledger.epsilon <= budget  # the final figure
    assert ledger.epsilon == pytest.approx(_exact(stop, kind), rel=1e-7)


def test_a_run_interrupted_between_shown_rounds_reports_the_exact_epsilon_of_the_rounds_it_ran() -> None:
    accountant = _accountant("pld")
    schedule = accountant.schedule_for(200)
    for _ in range(30):
        assert accountant.spend() == schedule.shown.get(accountant.rounds)
    assert 30 not in schedule.shown  # 29 and 32 are
    assert accountant.epsilon == pytest.approx(_exact(30), rel=1e-9)
    assert all(figure <= accountant.epsilon for r, figure in schedule.shown.items() if r <= 30)


def test_a_resumed_accountant_plans_the_same_schedule_and_ends_at_the_same_epsilon() -> None:
    budget = (_exact(120, with_count=True) + _exact(121, with_count=True)) / 2
    uninterrupted = _accountant("pld", with_count=True)
    schedule = uninterrupted.schedule_for(200, budget)
    for _ in range(schedule.last):
        uninterrupted.spend()
    crashed = _accountant("pld", with_count=True)
    crashed.schedule_for(200, budget)
    for _ in range(37):
        crashed.spend()
    resumed = _accountant("pld", with_count=True)
    resumed.load_state_dict(crashed.state_dict())
    assert resumed.rounds == 37 and resumed.schedule_for(200, budget) == schedule and schedule.last == 120
    figures = [resumed.spend() for _ in range(resumed.rounds, schedule.last)]
    assert figures[-1] == resumed.epsilon == uninterrupted.epsilon == schedule.shown[120] and resumed.rounds == 120


def test_a_worst_case_ledger_stops_at_the_first_case_over_the_budget_and_shows_the_larger_figure() -> None:
    cases = {"E": SHOWN_EVENT, "S": poisson_gaussian_round(0.02, 1.0)}  # S is the worse one up to about round 30

    def worst(rounds: int) -> float:
        return max(epsilon_after(event, rounds, 1e-5, "rdp") for event in cases.values())

    ledger = WorstCaseAccountant({case: RoundAccountant(event, 1e-5, "rdp") for case, event in cases.items()})
    budget = (worst(90) + worst(91)) / 2
    schedule = ledger.schedule_for(150, budget)
    assert schedule.last == 90 and list(schedule.shown) == [r for r in shown_rounds(150) if r < 90] + [90]
    for rounds_run, figure in schedule.shown.items():
        assert figure == pytest.approx(worst(rounds_run), rel=1e-12)
    for case, accountant in ledger.cases.items():
        assert accountant.schedule is not None and list(accountant.schedule.shown) == list(schedule.shown)
        assert accountant.schedule.shown[1] == pytest.approx(epsilon_after(cases[case], 1, 1e-5, "rdp"), rel=1e-12)
    figures = [ledger.spend() for _ in range(schedule.last)]
    assert [r for r, f in enumerate(figures, 1) if f is not None] == list(schedule.shown)
    assert ledger.epsilon == schedule.shown[90] == max(a.epsilon for a in ledger.cases.values())


def test_a_ledger_without_a_guarantee_has_infinite_epsilon_and_plans_nothing() -> None:
    ledger = NoAccountant()
    schedule = ledger.schedule_for(100, None)
    assert schedule.last == 100 and not schedule.shown and ledger.spend() == math.inf == ledger.epsilon
    assert NoAccountant().schedule_for(100, 5.0).last == 0  # infinite epsilon exceeds any budget


@pytest.mark.parametrize("budget_over_final", [None, 1.01, "stops"])
@pytest.mark.parametrize("with_count", [False, True])
def test_the_planned_final_figure_is_the_schedules_last_and_needs_no_curve_unless_the_budget_stops(
        budget_over_final: float | str | None, with_count: bool, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    rounds = 133
    whole = _exact(rounds, with_count=with_count)
    budget = (None if budget_over_final is None else whole * budget_over_final if isinstance(budget_over_final, float)
              else (_exact(78, with_count=with_count) + _exact(79, with_count=with_count)) / 2)
    stops = budget_over_final == "stops"
    planning = [0]
    start = RoundAccountant._start_planning

    def counted(self: RoundAccountant) -> None:
        planning[0] += 1
        start(self)

    monkeypatch.setattr(RoundAccountant, "_start_planning", counted)
    monkeypatch.setenv(memo.CACHE_ENV, str(tmp_path / "remembered"))  # no schedule remembered by another test
    memo.forget()
    final = _accountant(with_count=with_count).final(rounds, budget)
    assert planning[0] == (1 if stops else 0)  # the curve is composed only to find a budget's stop
    schedule = _accountant(with_count=with_count).schedule_for(rounds, budget)
    assert final == schedule.shown[schedule.last]
    figures = list(schedule.shown.values())
    assert figures == sorted(figures) and figures[-1] == max(figures)
    if stops:
        assert schedule.last == 78 and final <= budget  # type: ignore[operator]
    else:  # the whole run's figure, composed at once: the one a calibration computes for the same event
        assert schedule.last == rounds and final == whole
        assert all(figure == pytest.approx(_exact(r, with_count=with_count), rel=1e-7) for r, figure in schedule.shown.items())


def test_a_worst_case_ledgers_final_figure_is_the_larger_cases_whole_run_figure() -> None:
    cases = {"E": SHOWN_EVENT, "S": poisson_gaussian_round(0.02, 1.0)}
    rounds = 150
    ledger = WorstCaseAccountant({case: RoundAccountant(event, 1e-5, "pld") for case, event in cases.items()})
    final = ledger.final(rounds, None)
    assert final == max(epsilon_after(event, rounds, 1e-5, "pld") for event in cases.values())
    assert ledger.schedule_for(rounds, None).shown[rounds] == final
    assert NoAccountant().final(rounds, None) == math.inf
