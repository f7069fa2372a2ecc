"""The clocks on a CPU: one call on the wall clock, a call repeated, and how repeated runs are reported."""

import time

import torch

from prefillviz.machine.timers import median_and_spread, run_seconds, run_timed

CPU = torch.device("cpu")


def test_run_timed_returns_the_seconds_the_call_took_and_its_result():
    seconds, result = run_timed(lambda: time.sleep(0.05) or "done", CPU)
    assert result == "done"
    assert 0.05 <= seconds < 1.0


def test_run_seconds_times_every_call():
    calls = []
    seconds = run_seconds(lambda: calls.append(time.sleep(0.01)), 3, CPU)
    assert len(calls) == 3 and 0.03 <= seconds < 1.0


def test_median_and_spread_of_repeated_runs():
    assert median_and_spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "runs": 3}
