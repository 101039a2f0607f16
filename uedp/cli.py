"""The ``uedp`` command line. Every command has ``--help``; bad input prints one line and exits 2.

Prefect and the flows are imported inside commands, after the data home and Prefect's settings are
known, because Prefect reads its settings at import time.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer

from uedp.errors import UedpError

app = typer.Typer(
    name="uedp",
    help="Train language models on private text with user-, entity- and token-level differential privacy.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])

HOME_OPTION = typer.Option(None, "--home", help="Data home (default: $UEDP_HOME or ./.uedp).", show_default=False)


def _one_line(exc: BaseException) -> str:
    """A single readable line for errors users can fix (pydantic errors name the field)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first.get("loc", ())) or "input"
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        return f"invalid {field}: {message}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


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

    return wrapper  # type: ignore[return-value]


def _prepare_runtime(home_override: Optional[Path]):  # type: ignore[no-untyped-def]
    """Resolve the data home and point Prefect at it (no server needed) before Prefect is imported."""
    from storage.home import DataHome

    home = DataHome.from_env(home_override)
    if "PREFECT_API_URL" not in os.environ:
        os.environ.setdefault("PREFECT_HOME", str(home.prefect_home))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return home


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True),
) -> None:
    """uedp: user- and entity-level DP training of language models, as one Prefect + MLflow pipeline."""
    if version:
        from uedp import __version__

        typer.echo(f"uedp {__version__}")
        raise typer.Exit(0)


def _fmt(value: float, digits: int = 3) -> str:
    return "inf" if math.isinf(value) else f"{value:.{digits}g}"


@app.command()
@user_errors
def demo(
    home: Optional[Path] = HOME_OPTION,
    mechanisms: str = typer.Option("noiseless,deid,userdp", help="Comma-separated mechanisms to train."),
    categories: str = typer.Option("PER,LOC,ORG,PHONE,EMAIL", help="Entity categories treated as sensitive."),
    steps: int = typer.Option(300, help="Optimizer steps for noiseless and deid."),
    rounds: int = typer.Option(30, help="DP-FedAvg rounds for userdp."),
    q_user: float = typer.Option(0.5, help="Poisson sampling probability of a user per round."),
    noise_multiplier: float = typer.Option(1.0, help="Noise multiplier z (noise std = z * clip)."),
    target_epsilon: Optional[float] = typer.Option(None, help="Calibrate z to this epsilon instead."),
    clip: float = typer.Option(1.0, help="L2 bound on each user's model delta."),
    seed: int = typer.Option(0, help="Seed for data splits, initialisation, sampling and noise."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
) -> None:
    """Run the whole pipeline on the bundled demo corpus: ingest, detect, train, evaluate, log to MLflow.

    Needs no server, network or GPU (uses one when present). A second run reuses the ingested data.
    """
    data_home = _prepare_runtime(home)
    from flows.demo import DemoConfig, demo_flow
    from tasks.tracking import ui_command

    config = DemoConfig(
        home=str(data_home.root), mechanisms=[m.strip() for m in mechanisms.split(",") if m.strip()],
        categories=categories, steps=steps, rounds=rounds, q_user=q_user, noise_multiplier=noise_multiplier,
        target_epsilon=target_epsilon, clip=clip, seed=seed, device=device,
    )
    _check_before_running(config)
    typer.echo(f"uedp demo: data home {data_home.root}")
    outcome = demo_flow(config)
    ing, det = outcome.ingest, outcome.detect
    typer.echo(
        f"ingest: {'reused existing' if ing.reused else 'ingested'} dataset {ing.dataset!r} "
        f"({ing.sentences} sentences, {ing.users} users){' - inputs unchanged, nothing redone' if ing.reused else ''}"
    )
    typer.echo(f"detect: {'reused' if det.reused else 'wrote'} {det.entities} {det.detector} entity spans")
    _print_summary(outcome.runs)
    typer.echo(f"\nBrowse the runs:  {ui_command(data_home)}")


def _check_before_running(config: Any) -> None:
    """Fail on bad settings before any work starts: device, and calibration of a target epsilon."""
    from models.device import resolve_device
    from tasks.train import build_mechanism

    resolve_device(config.device)
    for train_config in config.train_configs():
        if train_config.is_private and train_config.target_epsilon is not None:
            build_mechanism(train_config)


def _print_summary(runs: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="uedp demo results (test perplexity; epsilon for the mechanism's privacy unit)")
    for column in ("mechanism", "categories", "epsilon", "delta", "z", "rounds", "perplexity", "MLflow run"):
        table.add_column(column, justify="right" if column in ("epsilon", "delta", "z", "rounds", "perplexity") else "left")
    for r in runs:
        table.add_row(
            r.mechanism, ",".join(r.categories), _fmt(r.epsilon), f"{r.delta:g}" if r.delta else "-",
            f"{r.noise_multiplier:.3g}" if r.noise_multiplier else "-", str(r.rounds), f"{r.perplexity_test:.2f}",
            r.run_id,
        )
    Console(width=140).print(table)
    for r in runs:
        if r.notes:
            typer.echo(f"note ({r.mechanism}): {r.notes}")


def main() -> None:
    """Console-script entry point."""
    sys.exit(app())


if __name__ == "__main__":
    main()
