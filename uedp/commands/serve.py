"""``uedp serve``: the local stack (Prefect server, worker and MLflow UI) until Ctrl-C or TERM."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Optional

import typer

from uedp.commands.common import HOME_OPTION, app, prepare_runtime, user_errors


@app.command()
@user_errors
def serve(
    home: Optional[Path] = HOME_OPTION,
    prefect_port: int = typer.Option(4200, help="Prefect server (API and UI) port on 127.0.0.1."),
    mlflow_port: int = typer.Option(5000, help="MLflow tracking server (and UI) port on 127.0.0.1."),
) -> None:
    """Start the stack on this machine until Ctrl-C: Prefect server, MLflow server, the cpu and gpu work
    pools with one worker each, and the deployments of deployments/prefect.yaml."""
    data_home = prepare_runtime(home)
    import signal
    import time

    from uedp.services.tracking import MODEL_TRAINING_VIEW
    from uedp.stack import LocalStack

    def terminate(signum: int, frame: object) -> None:  # kill -TERM stops the stack as Ctrl-C does
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second TERM must not cut the stopping short
        raise KeyboardInterrupt

    # Before anything starts: a TERM during start-up stops what has started, too (never orphaned servers).
    signal.signal(signal.SIGTERM, terminate)
    typer.echo(f"starting the uedp stack (logs: {data_home.stack_dir}) ...")
    with contextlib.suppress(KeyboardInterrupt), LocalStack(data_home, prefect_port, mlflow_port) as stack:
        typer.echo(f"Prefect UI  {stack.prefect_ui}   (deployments: {', '.join(stack.deployment_names())})")
        typer.echo(f"MLflow UI   {stack.mlflow_url}/{MODEL_TRAINING_VIEW}")
        typer.echo(f"CLI against it: export PREFECT_API_URL={stack.prefect_api} MLFLOW_TRACKING_URI={stack.mlflow_url}")
        typer.echo("Ctrl-C (or kill -TERM) stops everything.")
        sys.stdout.flush()
        while True:
            time.sleep(3600)
    typer.echo("stack stopped")
