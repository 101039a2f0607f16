"""A user's path for real: the local stack (Prefect server, MLflow server, cpu/gpu workers, deployments)
on loopback; a run of the demo deployment triggered through the API exactly as the UI's "Run" button
does; its MLflow runs read back from the MLflow server; both UIs opened in headless Chromium and
screenshotted (the deployment's parameter form, the run comparison). Bounded in time; the stack's
processes are stopped whatever happens.

Needs Debian's chromium (`make test` installs it when missing). Screenshots go to pytest's temporary
folder, or to ``$UEDP_SCREENSHOTS`` (how docs/screenshots/ was made).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import SyncPrefectClient

from uedp.services.tracking import experiment_page, run_link, run_page
from uedp.stack import LocalStack, free_port
from uedp.storage.home import DataHome

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,1100", "--virtual-time-budget=20000"]


def _chromium(url: str, profile: Path, *, screenshot: Path | None = None) -> str:
    """The rendered page's DOM, or a PNG of it."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "Debian's chromium is required (apt-get install chromium; `make test` does it)"
    args = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    done = subprocess.run([*args, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _visible(dom: str) -> str:
    """A page's text, tags dropped and whitespace collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", dom).split()).join("  ")


def _run_to_end(api: SyncPrefectClient, run_id: object, timeout: float = 420) -> tuple[str, object]:
    """Poll a flow run until it ends (or the time is up): its final state's name and the state."""
    deadline, state, current = time.monotonic() + timeout, "", None
    while time.monotonic() < deadline:
        current = api.read_flow_run(run_id).state  # type: ignore[arg-type]
        state = current.type.value if current else ""
        if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            break
        time.sleep(2)
    return state, current


def _stack_processes(home: DataHome) -> list[int]:
    """Every process that runs with this data home (the servers, the workers, their flow runs)."""
    mine = f"UEDP_HOME={home.root}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if mine in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:  # gone, or not ours
                pass
    return found


@contextlib.contextmanager
def _served(home: DataHome, workdir: Path) -> Iterator[LocalStack]:
    """`uedp serve` as a user starts it, in its own process; left with `kill -TERM` as a service manager does,
    which must stop the whole stack within 10 s (issue 50: it ignored TERM for over 30 s)."""
    stack = LocalStack(home, free_port(), free_port(), workdir=workdir)  # its addresses; `uedp serve` runs it
    env = os.environ | {"UEDP_HOME": str(home.root)}
    out = workdir.parent / "serve.out"
    with out.open("wb") as sink:
        serve = subprocess.Popen([sys.executable, "-m", "uedp.cli", "serve", "--prefect-port", str(stack.prefect_port),
                                  "--mlflow-port", str(stack.mlflow_port)], cwd=workdir, env=env, stdout=sink,
                                 stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while b"stops everything" not in out.read_bytes():
            assert serve.poll() is None and time.monotonic() < deadline, out.read_text(errors="replace")[-3000:]
            time.sleep(1)
        yield stack
        assert _stack_processes(home), "the stack's processes are not found by their environment"
        started = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=30)
        took = time.monotonic() - started
        assert took < 10, f"`uedp serve` took {took:.1f} s to stop on TERM"
        assert serve.returncode == 0 and "stack stopped" in out.read_text(), out.read_text(errors="replace")[-2000:]
        time.sleep(0.5)
        assert not _stack_processes(home), "processes of the stack outlived `uedp serve`"
    finally:
        if serve.poll() is None:
            serve.kill()
        for pid in _stack_processes(home):  # whatever a failed check left running
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _worker_log(stack: LocalStack) -> str:
    return (stack.logs / "worker-cpu.log").read_text(errors="replace")[-3000:]


@pytest.mark.slow
def test_deployed_demo_runs_on_a_worker_and_both_uis_show_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = DataHome.from_env(tmp_path / "home")
    screenshots = Path(os.environ.get("UEDP_SCREENSHOTS") or tmp_path / "screenshots")
    workdir = tmp_path / "workdir"  # where the workers run flows: nothing of the data may land here
    workdir.mkdir()
    with _served(home, workdir) as stack, SyncPrefectClient(stack.prefect_api) as api:
        # Prefect's own client: the endpoints the UI calls, with its retries when a busy server answers 503.
        # The ingest deployment with its defaults, as a new user's first click: the bundled corpus, no home.
        ingest = api.read_deployment_by_name("uedp-ingest/uedp-ingest")
        assert "home" not in ingest.parameters["config"]  # the served data home, never a folder of its own
        state, current = _run_to_end(api, api.create_flow_run_from_deployment(ingest.id).id)
        assert state == "COMPLETED", _worker_log(stack)
        assert (home.table_dir("demo", "sentences") / "data.parquet").is_file()

        deployment = api.read_deployment_by_name("uedp-demo/uedp-demo")
        # The form's shape: the mechanism parameters are a nested block (the server checks the JSON schema).
        config = {"mechanisms": ["noiseless", "userdp"], "categories": ["PERSON", "LOC"],
                  "settings": {"steps": 40, "rounds": 2}}
        # The UI's Run button: POST /deployments/{id}/create_flow_run with the form's parameters.
        run = api.create_flow_run_from_deployment(deployment.id, parameters={"config": config})
        state, current = _run_to_end(api, run.id)
        assert state == "COMPLETED", f"flow run ended {state or 'not at all'}; worker log:\n{_worker_log(stack)}"
        assert not list(workdir.iterdir()), "a flow run wrote into the worker's folder instead of the data home"
        # The deployment persists results: the flow run's return value is on disk, referenced by its state.
        stored = Path(getattr(current.data, "storage_key", ""))  # type: ignore[union-attr]
        assert stored.is_file() and stack.results in stored.parents

        client = MlflowClient(tracking_uri=stack.mlflow_url)
        experiment = client.get_experiment_by_name("demo")
        runs = client.search_runs([experiment.experiment_id])
        assert {r.data.params["mechanism"] for r in runs} == {"noiseless", "userdp"}
        assert all(r.info.status == "FINISHED" and r.data.tags["uedp.flow_run_id"] == str(run.id) for r in runs)
        assert all(r.data.params["categories"] == "LOC,PERSON" for r in runs)

        # The experiment opens in MLflow's model-training view (runs, charts), not on GenAI traces.
        assert experiment.tags.get("mlflow.experimentKind") == "custom_model_development"
        assert {r.info.run_name for r in runs} == {"noiseless-steps40-s0", "userdp-rounds2-s0"}  # shown whole in the table

        screenshots.mkdir(parents=True, exist_ok=True)
        form_url = f"{stack.prefect_ui}/deployments/deployment/{deployment.id}/run"
        form = _chromium(form_url, tmp_path / "chromium")
        assert "Mechanisms" in form and "Categories" in form  # the typed parameters became a form
        _chromium(form_url, tmp_path / "chromium", screenshot=screenshots / "prefect-run-form.png")
        ids = json.dumps([r.info.run_id for r in runs])
        compare_url = (f"{stack.mlflow_url}/#/compare-runs?runs={urllib.parse.quote(ids)}"
                       f"&experiments={urllib.parse.quote(json.dumps([experiment.experiment_id]))}"
                       "&workflowType=machine_learning")
        compare = _chromium(compare_url, tmp_path / "chromium")
        assert all(r.info.run_name in compare for r in runs)
        _chromium(compare_url, tmp_path / "chromium", screenshot=screenshots / "mlflow-compare-runs.png")
        # The pages uedp's commands print (issue 50: a run opened under the GenAI "Evaluation runs" view).
        runs_url = f"{stack.mlflow_url}/{experiment_page(experiment.experiment_id)}"
        table = _chromium(runs_url, tmp_path / "chromium")
        assert "Model training" in table and all(r.info.run_name in table for r in runs)
        assert "Evaluation runs" not in _visible(table)
        _chromium(runs_url, tmp_path / "chromium", screenshot=screenshots / "mlflow-runs.png")
        one = runs[0]
        monkeypatch.setenv("MLFLOW_TRACKING_URI", stack.mlflow_url)  # as `uedp serve` tells the CLI to
        printed = run_link(home, one.info.run_id)
        assert printed == f"{stack.mlflow_url}/{run_page(experiment.experiment_id, one.info.run_id)}"
        page = _visible(_chromium(printed, tmp_path / "chromium"))
        assert "Evaluation runs" not in page and " Runs " in page and "perplexity_test" in page
        bare = _visible(_chromium(printed.split("?")[0], tmp_path / "chromium"))  # the address without the view
        assert "Evaluation runs" in bare  # what the check above would have caught
    for name in ("prefect-run-form.png", "mlflow-compare-runs.png", "mlflow-runs.png"):
        assert (screenshots / name).stat().st_size > 20_000, name  # a rendered page, not a blank one
