"""What every command shares: the Typer app, the options several commands take, turning bad input into
one line and exit code 2, and the data home and Prefect settings a command runs with.

Nothing here imports the configuration models or the mechanisms (torch, dp_accounting: seconds): a command
that needs neither (``uedp datasets``, ``budget``, ``sql``, ``serve``) starts without them. The options
derived from the configuration models are in :mod:`.config_options`."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional, TypeVar

import typer

from uedp.errors import UedpError
from uedp.options import CONFIG_HELP, SET_HELP

app = typer.Typer(
    name="uedp",
    help="Train language models on private text with user-, entity- and token-level differential privacy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


F = TypeVar("F", bound=Callable[..., Any])


STORE_HELP = ("fsspec URL of a table store shared by several machines (s3://bucket/uedp, gs://..., file:///mnt/uedp): "
              "tables are read from and published to it; the local data home caches them.")


PROCESSES_HELP = ("torchrun processes for this training, one per GPU: each trains a share of every round's users "
                  "or examples (dpsgd: the same model as one process; userdp/uedp: the same epsilon).")


SEEDED_OPTION = typer.Option(False, "--seeded", help="Draw sampling and noise from --seed instead of the operating "
                             "system: reproducible, for tests and demos. The guarantee does not hold against anyone who "
                             "knows the seed; the run is tagged uedp.randomness=seeded.")


PRIVACY_DOC = "docs/PRIVACY.md"


HOME_OPTION = typer.Option(None, "--home", help="Data home (default: $UEDP_HOME or ./.uedp).", show_default=False)


CONFIG_OPTION = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False)


SET_OPTION = typer.Option(None, "--set", help=SET_HELP, show_default=False)


INTERRUPTED = ("interrupted (Ctrl-C). Run the same command again: finished work is reused, and a training resumes "
               "from its last checkpoint in the same MLflow run (--checkpoint-every sets how often one is saved)")


def _one_line(exc: BaseException) -> str:
    """A single readable line for errors users can fix (pydantic errors name the field)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        # Settings may sit in nested blocks (params.<mechanism>, settings, run): name the setting itself.
        loc = [str(p) for p in first.get("loc", ())]
        while len(loc) > 1 and loc[0] in ("params", "settings", "run", *_mechanism_names()):
            loc = loc[1:]
        field = ".".join(loc) or "input"
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        return f"invalid {field}: {message}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _mechanism_names() -> tuple[str, ...]:
    """The registered mechanisms (a validation error may sit in a block named for one), imported only then."""
    from uedp.privacy.mechanisms import registry

    return registry.names()


def user_errors(command: F) -> F:
    """Turn errors caused by bad input into ``error: ...`` on stderr and exit code 2."""
    from pydantic import ValidationError

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (UedpError, ValidationError) as exc:
            typer.echo(f"error: {_one_line(exc)}", err=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            typer.echo(f"\n{INTERRUPTED}", err=True)
            raise  # typer exits with 130, as a shell does for Ctrl-C

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def prefect_api(home: Any) -> Iterator[str]:
    """The Prefect API a command's flows run against (a temporary one of uedp's own when none is set)."""
    from uedp.prefect_server import prefect_api as api

    with api(home) as url:
        yield url


def remember_accounting_in_home(home: Any = None) -> None:
    """Calibrations and epsilon schedules are remembered across processes in the data home
    (``<home>/cache/accounting``, privacy.accounting.memo): a command that plans without a home
    (`uedp epsilon`) uses the default one when it exists, and creates none."""
    from uedp.privacy.accounting.memo import CACHE_ENV
    from uedp.storage.home import DEFAULT_HOME

    root = Path(home.root) if home is not None else Path(os.environ.get("UEDP_HOME") or DEFAULT_HOME).expanduser()
    if root.is_dir():
        os.environ.setdefault(CACHE_ENV, str(root / "cache" / "accounting"))


def prepare_runtime(home_override: Optional[Path]):  # type: ignore[no-untyped-def]
    """Resolve the data home and point Prefect at it (no server needed) before Prefect is imported."""
    from uedp.storage.home import DataHome

    home = DataHome.from_env(home_override)
    if "PREFECT_API_URL" not in os.environ:
        os.environ.setdefault("PREFECT_HOME", str(home.prefect_home))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Without a server nobody reads Prefect's run logs; the CLI prints its own summary and a one-line
    # error, so keep Prefect's console from repeating failures as tracebacks. With a server, log fully.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "CRITICAL" if "PREFECT_API_URL" not in os.environ else "INFO")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Categories named in a configuration (train --categories) resolve with this home's labels file, here and in
    # the processes a command starts (torchrun, workers): detection/categories.py reads it where no home is at hand.
    os.environ["UEDP_LABELS"] = str(home.labels_file)
    remember_accounting_in_home(home)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # transformers' "Loading weights" / "Writing model shards" bars on every logged model: uedp reports its own.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # MLflow announces creating and migrating its SQLite store on every first use: not the user's business.
    for noisy in ("mlflow.store.db.utils", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return home


def _print_version(value: bool) -> None:
    """Runs while the options are parsed, before Click asks for a command (so `uedp --version` alone works)."""
    if value:
        from uedp import __version__

        typer.echo(f"uedp {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True,
                                 callback=_print_version),
) -> None:
    """uedp: user- and entity-level DP training of language models, as one Prefect + MLflow pipeline."""


def csv_list(value: str | None) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def short_number(value: float, digits: int = 3) -> str:
    return "inf" if math.isinf(value) else f"{value:.{digits}g}"


_LIST_ITEM = re.compile(r"(?:[-*]|\d+\.) ")


def flowing_help(doc: str) -> str:
    """A command's docstring as help whose paragraphs flow to the terminal's width.

    Typer joins the lines of a help text's first paragraph but keeps every line break of the others, so a
    paragraph written over several source lines printed ragged (a word alone on a line wherever a source
    line ended past the terminal's width). Here the lines of each paragraph are joined; a paragraph Click
    marks verbatim (``\\b``), indented lines (an example) and list items keep their breaks."""
    paragraphs = []
    for paragraph in doc.split("\n\n"):
        if paragraph.startswith("\b"):
            paragraphs.append(paragraph)
            continue
        lines: list[str] = []
        for line in paragraph.split("\n"):
            keeps_break = not lines or line.startswith(" ") or _LIST_ITEM.match(line) or lines[-1].startswith(" ")
            if keeps_break:
                lines.append(line)
            else:
                lines[-1] = f"{lines[-1]} {line.strip()}"
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def flow_help_of(group: typer.Typer) -> None:
    """Give every command of ``group`` (and of its sub-groups) its docstring as flowing help, unless it
    states a help text of its own."""
    for info in group.registered_commands:
        if info.help is None and info.callback is not None:
            info.help = flowing_help(inspect.getdoc(info.callback) or "")
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            flow_help_of(sub.typer_instance)
