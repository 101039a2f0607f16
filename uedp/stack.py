"""The whole uedp stack on one machine, as ``uedp serve`` starts it: a Prefect server, an MLflow
tracking server (both on loopback), the ``cpu`` and ``gpu`` work pools with one process worker each,
and the deployments of ``deployments/prefect.yaml``.

Every process gets its own process group and log file under ``<data home>/stack/``; leaving the
context (or Ctrl-C on ``uedp serve``) stops them all, workers first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from uedp.deployments import PREFECT_YAML as DEPLOYMENTS
from uedp.errors import UedpError
from uedp.storage.home import DataHome

POOLS = ("cpu", "gpu")
# Seconds the stack's processes get, together, to exit on TERM before they are killed: `uedp serve` stops
# within this plus a second or two (a Prefect worker waits on its flow runs far longer than a user does).
STOP_GRACE = 5.0


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(process.pid, signum)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalStack:
    home: DataHome
    prefect_port: int = 4200
    mlflow_port: int = 5000
    startup_timeout: float = 180.0
    # Where the workers run flows (relative paths in deployment parameters resolve against it): the
    # directory `uedp serve` was started in. The code itself comes from the installed package.
    workdir: Path = field(default_factory=Path.cwd)
    _processes: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = field(default_factory=list)

    @property
    def prefect_api(self) -> str:
        return f"http://127.0.0.1:{self.prefect_port}/api"

    @property
    def prefect_ui(self) -> str:
        return f"http://127.0.0.1:{self.prefect_port}"

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def results(self) -> Path:
        """Where flow and task runs persist their return values (Prefect results)."""
        return self.home.prefect_home / "results"

    @property
    def logs(self) -> Path:
        return self.home.stack_dir

    @staticmethod
    def deployment_names() -> list[str]:
        """The deployments ``prefect.yaml`` defines, in its order (what `uedp serve` says it deployed)."""
        import yaml

        return [d["name"] for d in yaml.safe_load(DEPLOYMENTS.read_text(encoding="utf-8"))["deployments"]]

    def env(self) -> dict[str, str]:
        """What every process of the stack (and a flow run on a worker) sees."""
        return os.environ | {
            "PREFECT_API_URL": self.prefect_api, "PREFECT_HOME": str(self.home.prefect_home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO",
            "PREFECT_WORKER_QUERY_SECONDS": "2", "MLFLOW_TRACKING_URI": self.mlflow_url,
            "UEDP_HOME": str(self.home.root), "UEDP_WORKDIR": str(self.workdir), "TOKENIZERS_PARALLELISM": "false",
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "true",
            "PREFECT_LOCAL_STORAGE_PATH": str(self.results),
        }

    def __enter__(self) -> LocalStack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.home.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
        from uedp.services.mlflow_store import seed_store

        seed_store(self.home)  # the server would otherwise spend its first seconds migrating a new store
        prefect = [sys.executable, "-m", "prefect"]
        self._spawn("prefect-server", [*prefect, "server", "start", "--host", "127.0.0.1", "--port", str(self.prefect_port)])
        self._spawn("mlflow-server", [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1",
                                      "--port", str(self.mlflow_port), "--backend-store-uri", self.home.mlflow_tracking_uri,
                                      "--artifacts-destination", self.home.mlflow_artifacts.as_uri(), "--workers", "1"])
        self._wait_for(f"{self.prefect_api}/health", "Prefect server")
        self._wait_for(f"{self.mlflow_url}/health", "MLflow server")
        for pool in POOLS:
            self._run([*prefect, "work-pool", "create", pool, "--type", "process", "--overwrite"])
        self._run([*prefect, "work-pool", "set-concurrency-limit", "gpu", "1"])
        self._run([*prefect, "--no-prompt", "deploy", "--prefect-file", str(DEPLOYMENTS), "--all"])
        for pool in POOLS:
            self._spawn(f"worker-{pool}", [*prefect, "worker", "start", "--pool", pool, "--type", "process"])

    def stop(self) -> None:
        """TERM to every process group at once (workers first), then KILL to whatever is still running after
        :data:`STOP_GRACE` seconds in all: the stack is gone within seconds, not a grace period per process."""
        running = [(name, process) for name, process, _ in reversed(self._processes) if process.poll() is None]
        for _, process in running:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for _, process in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(deadline - time.monotonic(), 0.01))
        for _, process in running:
            _signal_group(process, signal.SIGKILL)  # also what a process left behind in its group
            process.wait()
        for _, _, log in self._processes:
            log.close()
        self._processes.clear()

    def _spawn(self, name: str, command: list[str]) -> None:
        log = (self.logs / f"{name}.log").open("wb")
        process = subprocess.Popen(command, cwd=self.workdir, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self._processes.append((name, process, log))

    def _run(self, command: list[str]) -> None:
        done = subprocess.run(command, cwd=self.workdir, env=self.env(), capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise UedpError(f"`{' '.join(command[2:])}` failed: {(done.stderr or done.stdout).strip()[-500:]}")

    def _wait_for(self, url: str, what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            for name, process, _ in self._processes:
                if process.poll() is not None:
                    raise UedpError(f"{name} exited with {process.returncode}; see {self.logs / (name + '.log')}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise UedpError(f"{what} did not answer at {url} within {self.startup_timeout:.0f} s; logs in {self.logs}")
