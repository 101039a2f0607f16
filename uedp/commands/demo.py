"""``uedp demo``: the whole pipeline on the bundled corpus, in a temporary data home."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from uedp.commands.common import (
    CONFIG_OPTION,
    HOME_OPTION,
    SET_OPTION,
    app,
    csv_list,
    prefect_api,
    prepare_runtime,
    user_errors,
)
from uedp.commands.config_options import DEMO_OPTIONS, LISTED, MECHANISMS_HELP
from uedp.commands.tables import print_summary
from uedp.options import default_of, merged, with_options
from uedp.services.demo_config import DemoConfig


@app.command()
@user_errors
@with_options(DEMO_OPTIONS)
def demo(
    home: Optional[Path] = HOME_OPTION,
    mechanisms: Optional[str] = typer.Option(None, help="Comma-separated mechanisms to train: "
                                             f"{MECHANISMS_HELP} {default_of(DemoConfig, 'mechanisms')}",
                                             show_default=False),
    categories: Optional[str] = typer.Option(None, help="Entity categories treated as sensitive (names, aliases such "
                                             "as PER, or composites such as PII) "
                                             f"{default_of(DemoConfig, 'categories')}", show_default=False),
    seed: Optional[int] = typer.Option(None, help="Seed for data splits, initialisation, sampling and noise "
                                       f"{default_of(DemoConfig, 'seed')}", show_default=False),
    secure: bool = typer.Option(False, "--secure", help="Draw sampling and noise from the operating system (as "
                                "`uedp train` does by default) instead of --seed: results then differ run to run."),
    device: Optional[str] = typer.Option(None, help=f"auto, cpu, cuda or cuda:N {default_of(DemoConfig, 'device')}",
                                         show_default=False),
    config_file: Optional[Path] = CONFIG_OPTION,
    set_: Optional[list[str]] = SET_OPTION,
    **settings: Any,
) -> None:
    """Run the whole pipeline on the bundled demo corpus: ingest, detect, train, evaluate, log to MLflow.

    Needs no server, network or GPU (uses one when present). A second run reuses the ingested data. The
    demo is seeded so its table is reproducible: its guarantee does not hold against anyone who knows
    the seed (the runs are tagged so); use --secure for real randomness. Every mechanism parameter is a
    flag (--rounds, --q-user, ...) or --set key=value.
    """
    data_home = prepare_runtime(home)
    from uedp.flows.demo import demo_flow
    from uedp.services.tracking import dataset_link

    given = {"mechanisms": csv_list(mechanisms) if mechanisms else None, "categories": categories, "seed": seed,
             "device": device, "randomness": "secure" if secure else None}
    values = merged(config_file, settings, set_, LISTED) | {k: v for k, v in given.items() if v is not None}
    config = DemoConfig(**{**values, "home": str(data_home.root)},
    )
    from uedp.services.launch import check_before_training

    for line in check_before_training(config.train_configs(), config.device):
        typer.echo(line)  # what the pre-flight could not plan before the data is read (training plans it)
    typer.echo(f"uedp demo: data home {data_home.root}")
    with prefect_api(data_home):
        outcome = demo_flow(config, progress=True)
    ing, det = outcome.ingest, outcome.detect
    typer.echo(
        f"ingest: {'reused existing' if ing.reused else 'ingested'} dataset {ing.dataset!r} "
        f"({ing.sentences} sentences, {ing.users} users){' - inputs unchanged, nothing redone' if ing.reused else ''}"
    )
    typer.echo(f"detect: {'reused' if det.reused else 'wrote'} {det.entities} {det.detector} entity spans")
    print_summary(outcome.runs)
    typer.echo(f"\nBrowse the runs:  {dataset_link(data_home, ing.dataset)}")
