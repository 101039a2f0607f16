"""`uedp epsilon`'s answers remembered whole (uedp.remembered_answers): a repeated plan prints the same bytes
without running the command, and anything that could change the answer (the arguments, the code, a config
file) is answered afresh; failures are not remembered."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from uedp import cli, remembered_answers
from uedp.remembered_answers import SOURCE_PACKAGES, answer, answer_file, rememberable

REPO = Path(__file__).resolve().parents[1]
PLAN = ["epsilon", "--mechanism", "dpsgd", "--users", "500", "--batch-size", "10", "--steps", "30",
        "--noise-multiplier", "1.1"]


@pytest.fixture
def plan_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "home"
    root.mkdir()
    monkeypatch.setenv("UEDP_HOME", str(root))
    return root


def _run_cli(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
             ) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["uedp", *args])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out, captured.err


def _counting(runs: list[int], real: bool = True) -> Any:
    def run() -> None:
        runs.append(1)
        if real:
            from uedp.commands import main

            main()
        sys.exit(0)
    return run


def test_a_repeated_plan_prints_the_same_bytes_without_running_the_command(
        plan_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    first = _run_cli(PLAN, monkeypatch, capsys)
    assert first[0] == 0 and "dpsgd: epsilon = " in first[1]
    assert answer_file(plan_home / "cache" / "answers", PLAN).is_file()
    runs: list[int] = []
    monkeypatch.setattr(sys, "argv", ["uedp", *PLAN])
    with pytest.raises(SystemExit) as exited:
        answer(PLAN, _counting(runs))
    assert exited.value.code == 0 and runs == []  # replayed: the command did not run
    assert capsys.readouterr() == (first[1], first[2])  # both streams, as the command wrote them


def test_another_argument_or_other_code_is_answered_afresh(
        plan_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _run_cli(PLAN, monkeypatch, capsys)
    other = [*PLAN[:-1], "1.3"]
    changed = _run_cli(other, monkeypatch, capsys)
    assert "z = 1.3" in changed[1]
    runs: list[int] = []
    identity = remembered_answers.source_identity()
    monkeypatch.setattr(remembered_answers, "source_identity", lambda: identity + "-edited")
    monkeypatch.setattr(sys, "argv", ["uedp", *PLAN])
    with pytest.raises(SystemExit):
        answer(PLAN, _counting(runs))
    assert runs == [1]  # a change to any installed module names another answer


def test_the_code_identity_reads_every_installed_package() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert set(SOURCE_PACKAGES) == {"uedp", *setuptools["package-dir"]}
    assert len(remembered_answers.source_identity()) == 64


def test_failures_config_files_and_help_are_not_remembered(
        plan_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = ["epsilon", "--mechanism", "nope", "--users", "3"]
    assert _run_cli(bad, monkeypatch, capsys)[0] == 2
    assert not (plan_home / "cache" / "answers").exists() or not any((plan_home / "cache" / "answers").iterdir())
    config = tmp_path / "plan.yaml"
    config.write_text("noise_multiplier: 1.1\n", encoding="utf-8")
    assert not rememberable([*PLAN, "--config", str(config)])
    assert not rememberable([*PLAN, f"--config={config}"])
    assert not rememberable([*PLAN, "--help"]) and not rememberable(["train", "demo"])
    assert rememberable(PLAN)


def test_without_a_data_home_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("UEDP_HOME", str(tmp_path / "absent"))
    code, out, _ = _run_cli(PLAN, monkeypatch, capsys)
    assert code == 0 and "dpsgd: epsilon" in out
    assert not (tmp_path / "absent").exists()


def test_a_damaged_answer_is_computed_again_and_written_over(
        plan_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    first = _run_cli(PLAN, monkeypatch, capsys)
    file = answer_file(plan_home / "cache" / "answers", PLAN)
    file.write_text("{not json", encoding="utf-8")
    again = _run_cli(PLAN, monkeypatch, capsys)
    assert again == first
    assert '"stdout"' in file.read_text(encoding="utf-8")


def test_the_labels_a_plan_checks_its_categories_against_name_its_answer(
        plan_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A plan's defaults are checked against the entity categories (the variables and the home's labels file):
    another taxonomy is another answer, never a replay of one checked against the old."""
    folder = plan_home / "cache" / "answers"
    named = answer_file(folder, PLAN)
    monkeypatch.setenv("UEDP_CATEGORIES", "PER")
    assert answer_file(folder, PLAN) != named
    monkeypatch.delenv("UEDP_CATEGORIES")
    (plan_home / "labels.yaml").write_text("labels: {}\n", encoding="utf-8")
    assert answer_file(folder, PLAN) != named


def test_an_answer_whose_name_cannot_be_computed_is_answered_unremembered(
        plan_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> str:
        raise RuntimeError("package uedp.flows is not installed where an answer's code can be read")

    monkeypatch.setattr(remembered_answers, "source_identity", broken)
    code, out, _ = _run_cli(PLAN, monkeypatch, capsys)
    assert code == 0 and "dpsgd: epsilon = " in out
    assert not (plan_home / "cache" / "answers").exists()
