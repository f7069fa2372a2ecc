"""The timing race of the dispatch table (dispatch_tuning._race): which candidates are timed further, and on what.

``run_seconds`` is scripted here, so these check the race's rules, not any machine's speed.
"""

import pytest
import torch

from prefillviz.backends import dispatch_tuning
from prefillviz.backends.dispatch_tuning import RACE_FACTOR, RUNS, _race


def scripted(monkeypatch, seconds: dict[str, list[float]]) -> tuple[dict, dict[str, int]]:
    """Calls whose ``run_seconds`` returns each candidate's next scripted time (per call), and the count of its
    timings."""
    timed = dict.fromkeys(seconds, 0)
    calls = {name: (lambda name=name: name) for name in seconds}

    def run_seconds(call, repeats, device):
        name = call()
        value = seconds[name][min(timed[name], len(seconds[name]) - 1)]
        timed[name] += 1
        return value * repeats

    monkeypatch.setattr(dispatch_tuning, "run_seconds", run_seconds)
    return calls, timed


def test_a_candidate_slow_only_on_its_first_call_is_timed_with_the_others(monkeypatch):
    # fresh pages for its outputs, or a burst of other work, make one first call 5x slow
    calls, timed = scripted(monkeypatch, {"fast": [1e-3], "unlucky": [5e-3, 0.9e-3]})
    timings, dropped, _ = _race(calls, torch.device("cpu"))
    assert dropped == [] and timings["unlucky"] == pytest.approx(0.9e-3) and timings["fast"] == pytest.approx(1e-3)
    assert timed == {"fast": 1 + RUNS, "unlucky": 2 + RUNS}  # one more call only for the one that looked slow


def test_a_candidate_slow_on_both_calls_is_out_after_them(monkeypatch):
    slow = (RACE_FACTOR + 1) * 1e-3
    calls, timed = scripted(monkeypatch, {"fast": [1e-3], "slow": [slow * 1.5, slow]})
    timings, dropped, spreads = _race(calls, torch.device("cpu"))
    assert dropped == ["slow"] and timings["slow"] == pytest.approx(slow) and "slow" not in spreads
    assert timed == {"fast": 1 + RUNS, "slow": 2}
