"""Progress output that reads well in a log file: whole lines at set shares of the work, never tqdm's
carriage-return floods (issue 20: a 100-round log was 30 KB on 4 lines)."""

from __future__ import annotations

import io

from uedp.progress import LineProgress, progress


def test_line_progress_writes_a_line_per_tenth_and_one_at_the_end() -> None:
    out = io.StringIO()
    bar = LineProgress(100, "train userdp-gpt2-s0", "rounds", stream=out)
    for _ in range(100):
        bar.update(1)
        bar.set_postfix(epsilon="1.2")
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(out.getvalue()) < 1_500
    assert len(lines) == 10  # 10%, 20%, ... 90%, then the end
    assert lines[0].startswith("train userdp-gpt2-s0: 10/100 rounds (10%), ") and "left, epsilon 1.2" in lines[0]
    assert lines[-1].startswith("train userdp-gpt2-s0: 100/100 rounds (100%), ") and "left" not in lines[-1]


def test_line_progress_without_a_total_reports_by_time() -> None:
    out = io.StringIO()
    bar = LineProgress(None, "ingest conll", "sentences", stream=out, every_seconds=0.0)
    bar.update(500)
    bar.update(500)
    bar.close()
    assert out.getvalue().splitlines() == [f"ingest conll: {n} sentences, 0s" for n in (500, 1000, 1000)]


def test_progress_off_a_terminal_is_lines_and_disabled_is_silent(capsys) -> None:  # type: ignore[no-untyped-def]
    bar = progress(4, "detect demo", "sentences")  # pytest's captured stderr is no terminal
    assert isinstance(bar.bar, LineProgress)  # inside the wrapper that raises a lost Ctrl-C (uedp.interrupts)
    for _ in range(4):
        bar.update(1)
    bar.close()
    silent = progress(4, "x", "steps", enabled=False)
    silent.update(4)
    silent.close()
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("detect demo: 4/4 sentences (100%)") and "x:" not in err


def test_time_left_is_timed_from_the_first_step_not_from_what_came_before_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An hour-long pretraining spent minutes on a first evaluation before step 1: the estimate taken from
    the start said 'about 8955m left'. Timed from the first step, it says what the steps take."""
    clock = iter([0.0, 600.0, 601.0, 602.0, 610.0])  # created; step 1 after 10 minutes; steps 2-3 a second each
    monkeypatch.setattr("uedp.progress.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    bar = LineProgress(10, "train noiseless-s0", "steps", stream=out, every_percent=10.0)
    bar.update(1)
    bar.update(1)
    bar.update(1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "train noiseless-s0: 1/10 steps (10%), 10m00s"  # no estimate from one step
    assert lines[1] == "train noiseless-s0: 2/10 steps (20%), 10m01s, about 8s left"
    assert lines[2] == "train noiseless-s0: 3/10 steps (30%), 10m02s, about 7s left"
