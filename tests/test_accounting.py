"""Accounting comes from dp_accounting, agrees with it, matches published values and calibrates."""

from __future__ import annotations

import dp_accounting
import pytest
from dp_accounting import pld, rdp

from uedp.privacy.accounting import (
    RoundAccountant,
    calibrate_noise_multiplier,
    check_delta,
    epsilon_after,
    poisson_gaussian_round,
)


def test_round_accountant_equals_dp_accounting_directly() -> None:
    event = poisson_gaussian_round(0.1, 1.1)
    accountant = RoundAccountant(event, 1e-5, "rdp")
    for _ in range(20):
        accountant.step()
    direct = rdp.RdpAccountant()
    direct.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.1)), 20)
    assert accountant.epsilon == pytest.approx(direct.get_epsilon(1e-5), rel=1e-12)
    assert accountant.rounds == 20
    pld_direct = pld.PLDAccountant()
    pld_direct.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.1)), 20)
    assert epsilon_after(event, 20, 1e-5, "pld") == pytest.approx(pld_direct.get_epsilon(1e-5), rel=1e-9)


def test_peek_does_not_spend_and_step_reports_the_peeked_value() -> None:
    accountant = RoundAccountant(poisson_gaussian_round(0.2, 1.0), 1e-5, "rdp")
    ahead = accountant.peek()
    assert accountant.rounds == 0 and accountant.epsilon == 0.0
    assert accountant.step() == ahead == epsilon_after(poisson_gaussian_round(0.2, 1.0), 1, 1e-5, "rdp")
    assert accountant.peek() == pytest.approx(epsilon_after(poisson_gaussian_round(0.2, 1.0), 2, 1e-5, "rdp"))


def test_epsilon_grows_with_rounds() -> None:
    accountant = RoundAccountant(poisson_gaussian_round(0.2, 1.0), 1e-5, "rdp")
    values = [accountant.step() for _ in range(5)]
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
    for _ in range(30):
        accountant.step()
    direct.compose(event, 30)
    assert accountant.epsilon == pytest.approx(direct.get_epsilon(1e-5), rel=1e-3)
    assert accountant.epsilon > epsilon_after(event, 30, 1e-5, kind)
    restored = RoundAccountant(event, 1e-5, kind, initial=count)
    restored.load_state_dict(accountant.state_dict())
    assert restored.peek() == pytest.approx(accountant.peek(), rel=1e-9)
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


def test_pld_reports_are_exact_at_block_ends_and_close_upper_bounds_inside_blocks() -> None:
    event = poisson_gaussian_round(0.05, 1.0)
    accountant = RoundAccountant(event, 1e-5, "pld")
    reports = [accountant.step() for _ in range(40)]
    for rounds in (1, 7, 9, 10, 13, 16, 21, 40):
        exact = epsilon_after(event, rounds, 1e-5, "pld")
        assert exact * (1 - 1e-6) <= reports[rounds - 1] <= exact * 1.15, rounds  # never below the true figure
    for block_end in (1, 2, 8, 10, 16, 20, 40):  # k = 1 up to round 8, then the largest power of two <= rounds / 4
        assert reports[block_end - 1] == pytest.approx(epsilon_after(event, block_end, 1e-5, "pld"), rel=1e-6)
    assert reports[8] == reports[9] and reports[8] > epsilon_after(event, 9, 1e-5, "pld")  # round 9 reports round 10's
    assert accountant.epsilon == pytest.approx(epsilon_after(event, 40, 1e-5, "pld"), rel=1e-6)


def test_the_budget_stop_is_exact_inside_a_block() -> None:
    event = poisson_gaussian_round(0.05, 1.0)
    at_22, at_23 = (epsilon_after(event, t, 1e-5, "pld") for t in (22, 23))
    accountant = RoundAccountant(event, 1e-5, "pld")
    while not accountant.would_exceed((at_22 + at_23) / 2):
        accountant.step()
    assert accountant.rounds == 22  # not 20, the start of the block whose end exceeds the budget
    assert accountant.epsilon == pytest.approx(at_22, rel=1e-6)
