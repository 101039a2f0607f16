"""One training configuration on several GPUs: the train task starts ``torchrun`` and waits for it.

``train_with_torchrun`` (called inside the Prefect task) writes the request to a file and runs
``python -m torch.distributed.run --standalone --nproc-per-node N -m uedp.services.torchrun REQUEST RESULT``.
Every process builds the same model and data; each trains its share of every round's users or
examples (``models.parallel``). The main process logs to MLflow, evaluates, writes checkpoints and the
result file; the task reads the result back. A crashed process fails the task, whose retry resumes
from the last checkpoint like a single-process run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from uedp.models.threads import available_cpus
from uedp.services.config import TrainConfig
from uedp.services.training import TrainResult, train_configuration, train_replica
from uedp.storage.home import DataHome


class TorchrunFailed(RuntimeError):
    """A torchrun process exited with an error (retried: transient until shown otherwise)."""


def train_with_torchrun(home: DataHome, config: TrainConfig, flow_run_id: str | None = None,
                        parent_run_id: str | None = None) -> TrainResult:
    """Run ``config`` under torchrun with ``config.processes`` processes; its output goes to ours."""
    with tempfile.TemporaryDirectory(dir=home.root, prefix=".torchrun-") as tmp:
        request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request.write_text(json.dumps({"home": str(home.root), "config": config.model_dump(),
                                       "flow_run_id": flow_run_id, "parent_run_id": parent_run_id}), encoding="utf-8")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={config.processes}", "-m", "uedp.services.torchrun", str(request), str(result)]
        tail: deque[str] = deque(maxlen=40)
        # torch.distributed.run sets OMP_NUM_THREADS=1 for several processes unless it is set: give each
        # process its share of the CPUs this one may use (or what the user chose) instead.
        share = os.environ.get("OMP_NUM_THREADS", str(max(1, available_cpus() // config.processes)))
        env = os.environ | {"OMP_NUM_THREADS": str(config.threads) if config.threads else share}
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                              text=True) as process:
            assert process.stdout is not None
            for line in process.stdout:
                sys.stdout.write(line)
                tail.append(line)
        if process.returncode or not result.is_file():
            raise TorchrunFailed(f"torchrun ({config.processes} processes) exited with {process.returncode}: "
                                 + "".join(tail)[-2000:])
        return TrainResult(**json.loads(result.read_text(encoding="utf-8")))


def _device_for_this_rank(config: TrainConfig) -> str:
    """``cuda:LOCAL_RANK`` when training on GPUs (one per process), else the configured device."""
    if config.device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return config.device


def main(request_file: str, result_file: str) -> None:
    request = json.loads(Path(request_file).read_text(encoding="utf-8"))
    config = TrainConfig.model_validate(request["config"])
    config = config.model_copy(update={"device": _device_for_this_rank(config)})
    home = DataHome(Path(request["home"]))
    backend = "nccl" if config.device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(torch.device(config.device))
    dist.init_process_group(backend)
    try:
        if dist.get_rank() == 0:
            result = train_configuration(home, config, request["flow_run_id"], request["parent_run_id"], progress=False)
            partial = Path(result_file).with_suffix(".partial")
            partial.write_text(json.dumps(asdict(result)), encoding="utf-8")
            partial.replace(result_file)
        else:
            train_replica(home, config)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
