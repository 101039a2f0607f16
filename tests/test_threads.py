"""torch's threads follow what the process may use: --threads, else OMP_NUM_THREADS, else the affinity
mask shared among torchrun's local processes (never the machine's core count)."""

from __future__ import annotations

import os

import pytest
import torch

from uedp.models.threads import available_cpus, default_threads, use_threads


@pytest.fixture(autouse=True)
def _restore_threads():  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_default_is_the_affinity_mask_not_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
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
