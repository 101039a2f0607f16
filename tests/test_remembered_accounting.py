"""Issue 63, item 1: calibration in seconds, with the same epsilons. The fast search returns the least noise
on its grid whose exact epsilon (dp_accounting, the run's own accountant) meets the target, within one grid
step of dp_accounting's own search; a remembered calibration or schedule (in memory, or from the folder
processes share) is the computed one, digit for digit; and `uedp epsilon` prints the same plan from memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import dp_accounting
import pytest
from typer.testing import CliRunner

from uedp.commands import app
from uedp.privacy.accounting import calibration, memo, rounds
from uedp.privacy.accounting.calibration import GRID_STEPS_PER_UNIT, TOLERANCE, calibrate_noise_multiplier
from uedp.privacy.accounting.events import (
    MIN_NOISE_MULTIPLIER,
    _epsilon_after,
    epsilon_after,
    group_replace_round,
    make_accountant,
    poisson_gaussian_round,
)
from uedp.privacy.accounting.rounds import RoundAccountant

COUNT = dp_accounting.GaussianDpEvent(10.0)  # a DP count of the units, released once before round 1

# (name, round event as a function of z, rounds, target, kind, adjacency, initial, floor): one row per way
# uedp's mechanisms calibrate, PLD and RDP, few and many rounds.
SETTINGS: list[tuple[str, Callable[[float], dp_accounting.DpEvent], int, float, str, str, object, float]] = [
    ("userdp, DP count, 300 rounds, pld", lambda z: poisson_gaussian_round(0.1, z), 300, 8.0, "pld", "add_remove",
     COUNT, MIN_NOISE_MULTIPLIER),
    ("dpsgd, 1000 steps, pld", lambda z: poisson_gaussian_round(0.01, z), 1000, 1.0, "pld", "add_remove", None,
     MIN_NOISE_MULTIPLIER),
    ("dpsgd, 20 steps, rdp", lambda z: poisson_gaussian_round(0.05, z), 20, 3.0, "rdp", "add_remove", None,
     MIN_NOISE_MULTIPLIER),
    ("selective, replace-one, 50 rounds", lambda z: poisson_gaussian_round(0.1, z), 50, 2.0, "pld", "replace", None,
     MIN_NOISE_MULTIPLIER),
    ("uedp-bounded, groups of 3, 30 rounds", lambda z: group_replace_round(0.2, z, 3), 30, 8.0, "pld", "replace",
     None, MIN_NOISE_MULTIPLIER * math.sqrt(3)),
]


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Nothing remembered: an empty shared folder and an empty process memory (restored afterwards)."""
    folder = tmp_path / "accounting"
    monkeypatch.setenv(memo.CACHE_ENV, str(folder))
    saved = dict(memo._MEMORY)
    memo.forget()
    yield folder
    memo._MEMORY.clear()
    memo._MEMORY.update(saved)


@pytest.mark.parametrize("setting", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_a_calibration_is_the_least_grid_noise_whose_exact_epsilon_meets_the_target(setting, fresh: Path) -> None:  # type: ignore[no-untyped-def]
    _, event_for, n_rounds, target, kind, adjacency, initial, floor = setting
    z = calibrate_noise_multiplier(event_for, n_rounds, target, 1e-5, kind, adjacency, initial, floor)  # type: ignore[arg-type]

    def exact(noise: float) -> float:  # dp_accounting's figure, composed afresh (nothing remembered)
        return _epsilon_after(event_for(noise), n_rounds, 1e-5, kind, adjacency, initial, None)  # type: ignore[arg-type]

    step = round(z * GRID_STEPS_PER_UNIT)
    assert z == step / GRID_STEPS_PER_UNIT  # on the grid, whichever way the search reached it
    assert exact(z) <= target < exact((step - 1) / GRID_STEPS_PER_UNIT)


def test_the_grid_answer_is_within_one_step_of_dp_accountings_own_search(fresh: Path) -> None:
    """The search uedp ran before (dp_accounting's Brent search to 1e-3) on the setting it is cheapest for."""
    event_for = SETTINGS[2][1]
    ours = calibrate_noise_multiplier(event_for, 20, 3.0, 1e-5, "rdp")
    theirs = dp_accounting.calibrate_dp_mechanism(
        lambda: make_accountant("rdp"), lambda z: dp_accounting.SelfComposedDpEvent(event_for(z), 20), 3.0, 1e-5,
        bracket_interval=dp_accounting.LowerEndpointAndGuess(MIN_NOISE_MULTIPLIER, 1.0), tol=1e-3)
    assert abs(ours - theirs) <= 1e-3 + TOLERANCE


def test_remembered_figures_are_the_computed_ones_and_are_shared_through_the_folder(
        fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    event_for = SETTINGS[0][1]
    z = calibrate_noise_multiplier(event_for, 300, 8.0, 1e-5, "pld", initial=COUNT)
    planned = RoundAccountant(event_for(z), 1e-5, "pld", initial=COUNT).schedule_for(300)
    assert list(fresh.glob("calibration-*.json")) and list(fresh.glob("schedule-*.json"))

    # Another process (here: this one, its memory emptied) reads them back and computes nothing
    memo.forget()

    def computed(*args: object) -> float:
        raise AssertionError("computed again, though the folder holds it")

    monkeypatch.setattr(calibration, "_calibrate", computed)
    monkeypatch.setattr(rounds, "_schedule_epsilons", computed)
    assert calibrate_noise_multiplier(event_for, 300, 8.0, 1e-5, "pld", initial=COUNT) == z
    accountant = RoundAccountant(event_for(z), 1e-5, "pld", initial=COUNT)
    again = accountant.schedule_for(300)
    assert again == planned and accountant.schedule == planned
    assert [accountant.spend() for _ in range(3)] == [planned.shown.get(r) for r in (1, 2, 3)]
    # a different setting is not taken for this one
    with pytest.raises(AssertionError, match="computed again"):
        calibrate_noise_multiplier(event_for, 300, 7.0, 1e-5, "pld", initial=COUNT)
    monkeypatch.undo()

    # A file in the folder that holds another figure under the same name is never taken for this one
    monkeypatch.setenv(memo.CACHE_ENV, str(fresh))
    memo.forget()
    (stored,) = fresh.glob("calibration-*.json")
    stored.write_text('{"arguments": "something else", "value": 99.0}', encoding="utf-8")
    assert calibrate_noise_multiplier(event_for, 300, 8.0, 1e-5, "pld", initial=COUNT) == z
    # ... and the path that remembers nothing gives the same figures
    monkeypatch.delenv(memo.CACHE_ENV)
    memo.forget()
    assert calibrate_noise_multiplier(event_for, 300, 8.0, 1e-5, "pld", initial=COUNT) == z
    assert RoundAccountant(event_for(z), 1e-5, "pld", initial=COUNT).schedule_for(300) == planned


@pytest.mark.parametrize("mechanism, flags", [
    ("userdp", ["--users", "946", "--q-user", "0.1", "--rounds", "300"]),
    ("dpsgd", ["--users", "2000", "--batch-size", "40", "--steps", "200"]),
    ("uedp-bounded", ["--users", "300", "--q-user", "0.2", "--rounds", "30"]),
    ("uedp", ["--users", "500", "--q-user", "0.05", "--q-entity", "0.05", "--rounds", "100"]),
])
def test_uedp_epsilon_prints_the_same_plan_from_memory(mechanism: str, flags: list[str], fresh: Path) -> None:
    command = ["epsilon", "--mechanism", mechanism, *flags, "--target-epsilon", "4"]
    first = CliRunner().invoke(app, command)
    assert first.exit_code == 0, first.output
    memo.forget()  # the next one reads the folder, as another process would
    second = CliRunner().invoke(app, command)
    assert second.exit_code == 0 and second.output == first.output
    assert f"{mechanism}: epsilon = " in first.output and "z = " in first.output


def test_a_release_too_rare_to_cost_anything_is_met_at_the_floor_not_a_crash(fresh: Path) -> None:
    """Review: a coarse epsilon of exactly 0 (one round, a tiny sampling rate) fed log(0) to the search."""
    with pytest.raises(calibration.MetAtFloor, match="met even with noise multiplier"):
        calibrate_noise_multiplier(lambda z: poisson_gaussian_round(1e-5, z), 1, 0.5, 1e-5, "pld")


def test_a_floor_between_grid_points_is_checked_at_the_floor_itself(fresh: Path) -> None:
    """uedp-bounded's floor 0.3 * sqrt(g) is no grid point: the target may be met at the grid point above the
    floor and not at the floor, and then that grid point is the answer, not an error."""
    event_for, floor = SETTINGS[0][1], 0.30005

    rounds = 20  # few: at this little noise a PLD is large, and the floor's case does not need many

    def exact(noise: float) -> float:  # remembered: the calibration below reads these two figures, not recomputes
        return epsilon_after(event_for(noise), rounds, 1e-5, "pld", "add_remove", COUNT)

    target = (exact(floor) + exact(0.3001)) / 2  # met at the grid point 0.3001, not at the floor 0.30005
    assert exact(floor) > target > exact(0.3001)
    assert calibrate_noise_multiplier(event_for, rounds, target, 1e-5, "pld", initial=COUNT, floor=floor) == 0.3001


def test_the_remembered_figures_name_the_code_that_computed_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A figure remembered by other code (dp_accounting upgraded, the accounting fixed) is never served."""
    key = memo.memo_key("epsilon", (1,))
    memo.code_identity.cache_clear()
    assert memo.memo_key("epsilon", (1,)) == key  # the same code: the same name, so a folder is reused
    monkeypatch.setattr(memo, "code_identity", lambda: "other code")
    assert memo.memo_key("epsilon", (1,)) != key


def test_a_near_flat_coarse_slope_does_not_throw_the_search_far(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The correction by one exact figure is bounded: a slope of rounding noise (two coarse figures a few grid
    steps apart) would start the bracket at z = e^1000 (an overflow) or at the floor (a long walk back up);
    bounded, the search takes a few exact figures from either side and finds the same grid point."""
    _, event_for, n_rounds, target, kind, adjacency, initial, floor = SETTINGS[1]
    expected = calibrate_noise_multiplier(event_for, n_rounds, target, 1e-5, kind, adjacency, initial, floor)  # type: ignore[arg-type]
    real_epsilon = calibration.epsilon_after
    for k, side in enumerate((0.999, 1.001), start=1):  # the coarse estimate a little below, then above, the answer
        exact: list[float] = []

        def counted(*args, _seen=exact, **kwargs):  # type: ignore[no-untyped-def]  # no coarse search: all exact
            _seen.append(args[0].event.noise_multiplier)
            return real_epsilon(*args, **kwargs)

        monkeypatch.setattr(calibration, "_estimate", lambda *_, side=side: (expected * side, -1e-9))
        monkeypatch.setattr(calibration, "epsilon_after", counted)
        memo.forget()
        # another target each time (not remembered), as close to it as makes the same grid point
        found = calibrate_noise_multiplier(event_for, n_rounds, target * (1 + k * 1e-12), 1e-5, kind, adjacency,  # type: ignore[arg-type]
                                           initial, floor)
        assert found == expected
        assert 2 <= len(exact) <= 16, exact  # unbounded: an overflow above, a walk up from the floor below
