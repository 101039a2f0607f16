"""How a command turns bad input into one line (``uedp.commands.common``), on its own.

The CLI tests check a few commands end to end; these pin the wrapper every command shares: a validation
error names the setting (not the nested block it sits in), uedp's own error gives its first line, both
exit 2 on stderr, Ctrl-C says how to resume and keeps the shell's code, and anything else is a bug that
keeps its traceback. The helpers the commands share are pinned too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import typer
from pydantic import BaseModel, ValidationError, field_validator

from uedp.commands.common import (
    INTERRUPTED,
    _one_line,
    csv_list,
    flowing_help,
    remember_accounting_in_home,
    short_number,
    user_errors,
)
from uedp.errors import UedpError
from uedp.privacy.accounting.memo import CACHE_ENV
from uedp.services.config import TrainConfig
from uedp.storage.home import DataHome


class Inner(BaseModel):
    clip: float

    @field_validator("clip")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be positive")
        return value


class Outer(BaseModel):
    settings: Inner


def _validation_error(data: dict[str, object]) -> ValidationError:
    with pytest.raises(ValidationError) as raised:
        Outer.model_validate(data)
    return raised.value


def test_a_validation_error_names_the_setting_not_the_block_it_sits_in() -> None:
    assert _one_line(_validation_error({"settings": {"clip": -1}})) == "invalid clip: must be positive"
    assert _one_line(_validation_error({"settings": {}})) == "invalid clip: Field required"


def test_a_training_configurations_error_names_the_mechanism_parameter() -> None:
    with pytest.raises(ValidationError) as raised:
        TrainConfig(dataset="demo", mechanism="dpsgd", clip=-1.0)  # type: ignore[call-arg]
    line = _one_line(raised.value)
    assert line.startswith("invalid clip:") and "\n" not in line


def test_uedps_own_error_gives_its_first_line_and_an_empty_one_its_type() -> None:
    assert _one_line(UedpError("no dataset 'x'\nmore detail")) == "no dataset 'x'"
    assert _one_line(UedpError("")) == "UedpError"


def _command(exc: BaseException | None) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @user_errors
    def run() -> None:
        """A command that fails the given way."""
        if exc is not None:
            raise exc
        typer.echo("done")

    return app


def _invoke(exc: BaseException | None) -> tuple[int, str, str, BaseException | None]:
    from typer.testing import CliRunner

    result = CliRunner().invoke(_command(exc), [])
    return result.exit_code, result.stdout, result.stderr, result.exception


def test_bad_input_is_one_line_on_stderr_with_exit_code_2() -> None:
    code, out, err, _ = _invoke(UedpError("dataset 'x' is not ingested\nhint"))
    assert (code, out, err) == (2, "", "error: dataset 'x' is not ingested\n")
    code, _, err, _ = _invoke(_validation_error({"settings": {"clip": 0}}))
    assert (code, err) == (2, "error: invalid clip: must be positive\n")


def test_a_command_that_succeeds_is_untouched() -> None:
    code, out, err, _ = _invoke(None)
    assert (code, out, err) == (0, "done\n", "")


def test_ctrl_c_says_how_to_resume_and_is_not_swallowed() -> None:
    code, _, err, _ = _invoke(KeyboardInterrupt())
    assert INTERRUPTED in err and "resumes from its last checkpoint" in err
    assert code == 130  # as a shell reports Ctrl-C, not bad input's 2


def test_a_bug_is_not_dressed_as_bad_input() -> None:
    code, _, err, exc = _invoke(ZeroDivisionError("division by zero"))
    assert code == 1 and "error:" not in err and isinstance(exc, ZeroDivisionError)


def test_the_accounting_memo_goes_to_an_existing_home_and_no_home_is_created(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    missing = tmp_path / "nowhere"
    monkeypatch.setenv("UEDP_HOME", str(missing))
    remember_accounting_in_home()
    assert CACHE_ENV not in os.environ and not missing.exists()

    home = DataHome.from_env(tmp_path / "home")
    home.root.mkdir(parents=True, exist_ok=True)
    remember_accounting_in_home(home)
    assert os.environ[CACHE_ENV] == str(home.root / "cache" / "accounting")


def test_lists_and_numbers_as_the_commands_read_and_print_them() -> None:
    assert csv_list("a, b,,c ") == ["a", "b", "c"]
    assert csv_list(None) == [] and csv_list("") == [] and csv_list(" , ") == []
    assert short_number(float("inf")) == "inf" and short_number(8.0) == "8" and short_number(0.123456) == "0.123"
    assert short_number(12345.6, digits=2) == "1.2e+04"


def test_help_paragraphs_flow_and_examples_lists_and_verbatim_blocks_keep_their_breaks() -> None:
    doc = ("First line.\n\nA paragraph written\nover three\nsource lines.\n\n"
           "Items:\n- one\n  continued\n- two\n\n\bverbatim\nblock\n\nExample:\n    uedp train demo\n    uedp sweep demo")
    assert flowing_help(doc) == ("First line.\n\nA paragraph written over three source lines.\n\n"
                                 "Items:\n- one\n  continued\n- two\n\n\bverbatim\nblock\n\n"
                                 "Example:\n    uedp train demo\n    uedp sweep demo")


def test_a_commands_help_reads_as_flowing_paragraphs_in_the_terminal() -> None:
    """Every command's docstring is handed to Typer joined (Typer keeps the line breaks of every paragraph
    after the first): a paragraph wraps at the terminal's width, not where its source lines ended."""
    from typer.testing import CliRunner

    from uedp.commands import load

    app = load()
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "100"}, terminal_width=100)
    assert result.exit_code == 0
    assert "(defaults from the configuration, shown below)" in " ".join(result.stdout.split())
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "shown" not in lines and "resumes" not in lines  # no word left alone where a source line ended
    helps = [info.help for info in app.registered_commands]
    assert all(h and "\n" not in h.split("\n\n")[0] for h in helps)
