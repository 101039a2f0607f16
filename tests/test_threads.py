"""torch's threads follow what the process may use: --threads, else OMP_NUM_THREADS, else the CPUs of the
affinity mask that other work leaves free (measured from /proc/stat), shared among torchrun's local
processes and concurrent trainings (never the machine's core count); a training says which."""

from __future__ import annotations

import os

import pytest
import torch

from uedp.models import threads as threads_module
from uedp.models.threads import (
    CONCURRENT_TRAININGS,
    ThreadChoice,
    available_cpus,
    busy_cpus,
    choose_threads,
    default_threads,
    measure_busy,
    read_proc_stat,
    use_threads,
)

# /proc/stat's per-CPU lines: user nice system idle iowait irq softirq steal guest guest_nice (ticks)
BEFORE = {0: (1000, 5000), 1: (4000, 5000)}
# 20 ticks later: cpu0 spent all 20 busy (another process), cpu1 all 20 idle (or waiting on I/O)
AFTER = {0: (1000, 5020), 1: (4020, 5020)}


def _snapshots(*snapshots: dict[int, tuple[int, int]]):  # type: ignore[no-untyped-def]
    taken = iter(snapshots)
    return lambda: next(taken)


@pytest.fixture(autouse=True)
def _restore_threads():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Neither OMP_NUM_THREADS (conftest sets it) nor torchrun's or the workers' sharing set."""
    for name in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE", CONCURRENT_TRAININGS):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_default_is_the_affinity_mask_not_the_machine(unset: pytest.MonkeyPatch) -> None:
    monkeypatch = unset
    monkeypatch.setattr(threads_module, "measure_busy", lambda cpus: 0.0)  # an idle machine
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert available_cpus() == 6 and default_threads() == 6
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # four torchrun processes share the six CPUs
    assert default_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user already chose
    assert default_threads() == 3


def test_use_threads_sets_torch_and_refuses_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert use_threads() == 1 and torch.get_num_threads() == 1
    assert use_threads(2) == 2 and torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="at least 1"):
        use_threads(0)


def test_training_threads_flush_denormal_floats() -> None:
    """Noisy weights push activations below float32's normal range, where the CPU slows tenfold or more:
    training's thread setup makes such numbers compute as 0 (the test process' own threads see it)."""
    try:
        supported = torch.set_flush_denormal(False)  # False: this CPU has no denormals-are-zero mode
        tiny = torch.tensor([1e-39], dtype=torch.float64).float()
        assert float(tiny * 1.0) > 0  # a denormal float32, computed as one
        use_threads(1)
        assert float(tiny * 1.0) == (0.0 if supported else float(tiny))
    finally:
        torch.set_flush_denormal(True)


def test_proc_stat_is_read_per_cpu_with_iowait_as_idle(tmp_path) -> None:  # type: ignore[no-untyped-def]
    stat = tmp_path / "stat"
    stat.write_text("cpu  30 0 10 160 8 0 0 0 0 0\ncpu0 20 0 5 70 4 0 0 1 7 0\ncpu1 10 0 5 90 4 0 0 0 0 0\n"
                    "intr 1 2 3\nctxt 99\n", encoding="ascii")
    # the aggregate line is left out; guest time (already in user) is not counted twice
    assert read_proc_stat(str(stat)) == {0: (74, 100), 1: (94, 109)}


def test_one_of_two_cpus_busy_with_other_work_leaves_one_thread(unset: pytest.MonkeyPatch) -> None:
    """Issue 37: `make demo` took 14 min on a busy 2-core machine with two threads, 2.5 min with one."""
    unset.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert busy_cpus(BEFORE, AFTER, {0, 1}) == pytest.approx(1.0)
    assert busy_cpus(BEFORE, AFTER, {1}) == 0.0  # only the CPUs this process may use count
    slept: list[float] = []
    busy = measure_busy({0, 1}, read=_snapshots(BEFORE, AFTER), sleep=slept.append, own_seconds=lambda: 0.0)
    assert busy == pytest.approx(1.0) and slept == [0.2]
    choice = choose_threads(busy=lambda cpus: measure_busy(cpus, read=_snapshots(BEFORE, AFTER), sleep=lambda s: None,
                                                           own_seconds=lambda: 0.0))
    assert choice == ThreadChoice(1, "free CPUs", cpus=2, busy=1)
    assert choice.line() == "torch: 1 thread (2 CPUs, 1 busy with other work; --threads or OMP_NUM_THREADS to choose)"
    # This process' own CPU time in the window (its other threads) is not other work.
    clock = iter([0.0, 0.2])
    assert measure_busy({0, 1}, read=_snapshots(BEFORE, AFTER), sleep=lambda s: None,
                        own_seconds=lambda: next(clock)) == pytest.approx(0.0)
    # An idle machine gives every CPU; a light background load (a tenth of a CPU) does not cost one.
    assert choose_threads(busy=lambda cpus: 0.1).threads == 2
    assert choose_threads(busy=lambda cpus: 0.6).threads == 1
    assert choose_threads(busy=lambda cpus: 2.0) == ThreadChoice(1, "free CPUs", cpus=2, busy=2)  # at least one


def test_without_proc_stat_the_load_average_is_used_else_every_cpu(unset: pytest.MonkeyPatch) -> None:
    def missing() -> dict[int, tuple[int, int]]:
        raise FileNotFoundError("/proc/stat")

    unset.setattr(os, "getloadavg", lambda: (1.0, 0.5, 0.2))
    assert measure_busy({0, 1, 2, 3}, read=missing, sleep=lambda s: None) == 1.0
    unset.delattr(os, "getloadavg")
    assert measure_busy({0, 1}, read=missing, sleep=lambda s: None) is None
    unset.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    unmeasured = choose_threads(busy=lambda cpus: None)
    assert unmeasured.threads == 2 and "their load unmeasured" in unmeasured.line()


def test_concurrent_trainings_share_the_free_cpus(unset: pytest.MonkeyPatch) -> None:
    unset.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    idle = lambda cpus: 0.0  # noqa: E731
    assert choose_threads(concurrent=2, busy=idle) == ThreadChoice(1, "free CPUs", cpus=2, sharers=2)
    assert "shared by 2 jobs" in choose_threads(concurrent=2, busy=idle).line()
    unset.setenv(CONCURRENT_TRAININGS, "2")  # a worker that runs two trainings at once
    assert choose_threads(busy=idle).threads == 1
    unset.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert choose_threads(busy=lambda cpus: 2.0).threads == 3  # 6 free CPUs, 2 trainings
    unset.setenv("LOCAL_WORLD_SIZE", "2")
    assert choose_threads(busy=lambda cpus: 2.0).threads == 1  # 6 free CPUs, 2 trainings x 2 torchrun processes


def test_an_explicit_choice_wins_and_is_not_measured(unset: pytest.MonkeyPatch) -> None:
    def never(cpus):  # type: ignore[no-untyped-def]
        raise AssertionError("measured the load although the user chose")

    unset.setattr(threads_module, "measure_busy", never)
    assert choose_threads(3, concurrent=4, busy=never) == ThreadChoice(3, "--threads")
    assert choose_threads(3).line() == "torch: 3 threads (--threads)"
    unset.setenv("OMP_NUM_THREADS", "2")
    assert choose_threads(busy=never).line() == "torch: 2 threads (OMP_NUM_THREADS)"
    assert choose_threads(1, busy=never).threads == 1  # --threads over OMP_NUM_THREADS
    assert use_threads() == 2 and torch.get_num_threads() == 2


def test_a_training_says_the_threads_it_uses_once(home, unset: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """A real tiny `train_configuration` with neither --threads nor OMP_NUM_THREADS: the free CPUs, said once
    on stderr (a flow's tasks say it in the flow run's log: ``report_to``)."""
    from uedp.detection.pipeline import DetectorConfig
    from uedp.flows.demo import DEMO_CORPUS
    from uedp.services.config import TrainConfig
    from uedp.services.detect import detect_entities
    from uedp.services.training import train_configuration
    from uedp.storage.ingest import IngestOptions, ingest

    ingest(home, "demo", [DEMO_CORPUS], IngestOptions(format="conll2003"))
    detect_entities(home, "demo", DetectorConfig(detectors=["gold"]))
    unset.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    unset.setattr(threads_module, "measure_busy", lambda cpus: 1.0)  # one of the two CPUs busy elsewhere
    config = TrainConfig(dataset="demo", mechanism="noiseless", steps=2, checkpoint_every=0, randomness="seeded")
    capsys.readouterr()
    train_configuration(home, config, progress=False)
    said = [line for line in capsys.readouterr().err.splitlines() if "torch:" in line]
    assert said == [f"{config.run_name()}: torch: 1 thread (2 CPUs, 1 busy with other work; --threads or "
                    "OMP_NUM_THREADS to choose)"]
    assert torch.get_num_threads() == 1
    lines: list[str] = []
    train_configuration(home, config.model_copy(update={"threads": 2, "seed": 1}), progress=False,
                        report_to=lines.append)
    assert [line for line in lines if "torch:" in line] == ["noiseless-steps2-s1: torch: 2 threads (--threads)"]
