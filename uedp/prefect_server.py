"""The temporary Prefect API server a CLI command runs its flows against when no server is configured.

Prefect starts one of its own in that case (its "ephemeral" server), but a busy machine outlasts its
20-second start-up wait (a raw ``RuntimeError`` traceback), and a ``kill -9`` of the command leaves
that server running with parent PID 1. uedp starts the same server itself instead:

- on Linux the child asks the kernel to kill it when its parent dies (``PR_SET_PDEATHSIG``), and its PID
  is recorded under the data home, so the next command ends any that survived anyway (elsewhere a
  killed command's server must be ended by hand);
- the start-up wait is measured in wall-clock time (``UEDP_PREFECT_STARTUP_SECONDS``, default 180) and
  a port taken meanwhile is retried on another;
- failing to start is one line naming the log file, never a traceback.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from uedp.errors import UedpError
from uedp.processes import process_alive
from uedp.storage.home import DataHome

STARTUP_SECONDS_ENV = "UEDP_PREFECT_STARTUP_SECONDS"
DEFAULT_STARTUP_SECONDS = 180.0
PID_PREFIX = "temporary-server-"  # temporary-server-<parent pid>.pid holds the server's pid
_PR_SET_PDEATHSIG = 1
_PORT_TAKEN = 3  # uvicorn's exit code when it cannot start (a taken port among other causes)
# Loopback health checks never go through HTTP(S)_PROXY.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def startup_seconds() -> float:
    raw = os.environ.get(STARTUP_SECONDS_ENV, "")
    try:
        return float(raw) if raw else DEFAULT_STARTUP_SECONDS
    except ValueError:
        raise UedpError(f"{STARTUP_SECONDS_ENV}={raw!r} is not a number of seconds") from None


# Looked up in the parent: calling dlopen between fork and exec can deadlock a threaded parent.
_PRCTL = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None) if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """Runs in the child between fork and exec (Linux): SIGKILL it when the process that started it dies."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _is_temporary_server(pid: int) -> bool:
    """True when ``pid`` is alive and is a Prefect API server started like ours (never another program
    that reused the PID)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"prefect.server.api.server:create_app" in command


def end_survivors(home: DataHome) -> int:
    """End the temporary servers of commands that died without ending them (where the kernel's parent
    death signal is missing); a running command's server is left alone. Returns how many were ended."""
    ended = 0
    for record in home.prefect_home.glob(f"{PID_PREFIX}*.pid"):
        parent = record.stem.removeprefix(PID_PREFIX)
        if not parent.isdigit() or process_alive(int(parent)):
            continue
        try:
            server = record.read_text(encoding="utf-8").strip()
        except OSError:  # another command ended it first
            continue
        if server.isdigit() and _is_temporary_server(int(server)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(server), signal.SIGKILL)
                ended += 1
        record.unlink(missing_ok=True)
    return ended


class TemporaryServer:
    """One Prefect API server (no UI) on a free loopback port, for the life of the ``with`` block."""

    def __init__(self, home: DataHome, timeout: float | None = None):
        self.home = home
        self.timeout = startup_seconds() if timeout is None else timeout
        self.log_file = home.prefect_home / "temporary-server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def _record(self) -> Path:
        return self.home.prefect_home / f"{PID_PREFIX}{os.getpid()}.pid"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def __enter__(self) -> TemporaryServer:
        self.home.prefect_home.mkdir(parents=True, exist_ok=True)
        end_survivors(self.home)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self) -> subprocess.Popen[bytes]:
        import prefect

        self.port = _free_port()
        command = [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parent.parent),
                   "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
                   "--port", str(self.port), "--log-level", "error", "--lifespan", "on"]
        env = os.environ | {"PREFECT_UI_ENABLED": "0", "PREFECT_HOME": str(self.home.prefect_home),
                            "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        with self.log_file.open("ab") as log:
            # Its own session: a terminal's Ctrl-C goes to the command's process group, and a server stopped
            # by it before the command has reported its interrupted flow run turns a clean stop into a minute
            # of connection errors. It still dies with the command (the parent-death signal, stop()).
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                                       start_new_session=True)
        self._record.write_text(f"{process.pid}\n", encoding="utf-8")
        return process

    def _start(self) -> None:
        self.process = self._spawn()
        deadline = time.monotonic() + self.timeout
        retries = 3
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code == _PORT_TAKEN and retries and "address already in use" in self._log_tail().lower():
                retries -= 1  # another program took the port between our check and its bind
                time.sleep(0.5)
                self.process = self._spawn()
                continue
            if code is not None:
                raise UedpError(f"Prefect's temporary server exited with code {code} while starting; "
                                f"see {self.log_file}")
            with contextlib.suppress(OSError), _DIRECT.open(f"{self.api_url}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
            time.sleep(0.25)
        raise UedpError(f"Prefect's temporary server did not answer within {self.timeout:.0f} s (a busy machine?); "
                        f"set {STARTUP_SECONDS_ENV} higher, or run against a server (`uedp serve`, then "
                        f"PREFECT_API_URL); its log: {self.log_file}")

    def _log_tail(self) -> str:
        try:
            return self.log_file.read_text(encoding="utf-8", errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        self._record.unlink(missing_ok=True)


@contextlib.contextmanager
def prefect_api(home: DataHome) -> Iterator[str]:
    """Run the block against the configured Prefect API, or against a temporary server of our own when
    none is configured; yields the API URL."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    configured = PREFECT_API_URL.value()
    if configured:
        yield str(configured)
        return
    with TemporaryServer(home) as server, temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        try:
            yield server.api_url
        finally:
            flush_prefect_queues()  # while the server still runs


def flush_prefect_queues(timeout: float = 15.0) -> None:
    """Deliver the run logs and events Prefect still queues, and stop its queue workers, before our
    temporary server stops. The workers are process-wide and keep the URL they started with: events
    left queued for a server that is gone are retried at about one per client timeout (a minute) when
    the process exits or the next server's test harness drains, so a command could sit for minutes."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        try:
            worker.drain_all(timeout=timeout)
        except Exception:  # best effort: a failed flush loses logs, never the command's result
            continue
