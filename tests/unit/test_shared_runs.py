"""Identical runs measured once (ui/shared_runs.py): sessions asking the same inputs while a run is
queued, running or just finished share it; different inputs never do; a finished result expires; an
owner that fails leaves the others to measure; a session asking again gets a new measurement."""

import threading
import time

import pytest

from prefillviz.engine.errors import PrefillVizError
from prefillviz.ui.run_queue import RunQueue
from prefillviz.ui.shared_runs import SharedRuns


def slow_measure(calls: list, seconds: float = 0.3, value="result"):
    def measure():
        calls.append(threading.get_ident())
        time.sleep(seconds)
        return value

    return measure


def in_threads(*jobs):
    results = [None] * len(jobs)

    def run(i, job):
        results[i] = job()

    threads = [threading.Thread(target=run, args=(i, job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)  # the first one owns the run
    for thread in threads:
        thread.join(10)
    return results


def test_sessions_asking_the_same_inputs_share_one_measurement():
    runs, calls = SharedRuns(), []
    key = ("prefill page", "bundled", "cpu", "float32", "The capital of France is")
    shared = in_threads(*[lambda i=i: runs.run(key, slow_measure(calls), viewer=f"session {i}", poll_s=0.02)
                          for i in range(5)])
    assert len(calls) == 1 and runs.measured == 1
    assert all(s.result == "result" for s in shared)
    assert [s.joined for s in shared] == [False, True, True, True, True]
    assert max(s.viewers for s in shared) == 5


def test_different_inputs_never_share():
    runs, calls = SharedRuns(), []
    shared = in_threads(
        lambda: runs.run(("prefill page", "prompt one"), slow_measure(calls, value=1), viewer="a", poll_s=0.02),
        lambda: runs.run(("prefill page", "prompt two"), slow_measure(calls, value=2), viewer="b", poll_s=0.02),
    )
    assert len(calls) == 2 and [s.result for s in shared] == [1, 2] and not any(s.joined for s in shared)


def test_a_finished_result_is_shared_for_a_while_then_measured_anew():
    runs, calls = SharedRuns(ttl_s=0.2), []
    assert not runs.run("key", slow_measure(calls, 0.0), viewer="a").joined
    assert runs.run("key", slow_measure(calls, 0.0), viewer="b").joined  # just finished: shared
    time.sleep(0.3)
    assert not runs.run("key", slow_measure(calls, 0.0), viewer="c").joined  # expired: measured again
    assert len(calls) == 2 and len(runs) == 1


def test_a_session_that_asks_again_gets_a_new_measurement():
    runs, calls = SharedRuns(), []
    runs.run("key", slow_measure(calls, 0.0), viewer="a")
    again = runs.run("key", slow_measure(calls, 0.0), viewer="a")
    assert not again.joined and len(calls) == 2


def test_when_the_owner_fails_the_joiners_measure_for_themselves():
    runs, calls = SharedRuns(), []

    def failing():
        time.sleep(0.2)
        raise PrefillVizError("the owner's session went away")

    def owner():
        with pytest.raises(PrefillVizError):
            runs.run("key", failing, viewer="owner", poll_s=0.02)
        return None

    _, joined = in_threads(owner, lambda: runs.run("key", slow_measure(calls, 0.0), viewer="joiner", poll_s=0.02))
    assert len(calls) == 1 and not joined.joined and joined.result == "result"


def test_entries_are_bounded():
    runs = SharedRuns(max_entries=3)
    for i in range(10):
        runs.run(("prompt", i), lambda: i, viewer="a")
    assert len(runs) == 3


def test_the_queue_estimates_the_wait_from_the_last_runs():
    queue = RunQueue()
    assert queue.estimate_s(2) is None  # nothing measured yet
    for seconds in (0.05, 0.1, 0.15):
        with queue.turn():
            time.sleep(seconds)
    assert queue.estimate_s(2) == pytest.approx(0.2, abs=0.05)  # 2 runs ahead x the median hold of 0.1 s


def test_a_session_that_goes_away_while_waiting_leaves_the_queue():
    """Streamlit stops a gone session's script thread at its next call into Streamlit: here, the
    on_wait that redraws its place in line. Its ticket goes, and the run behind it is next."""
    queue, order = RunQueue(), []
    release = threading.Event()

    class SessionGone(Exception):
        pass

    def holder():
        with queue.turn():
            order.append("holder runs")
            release.wait(5)

    def gone(ahead):
        raise SessionGone

    def leaver():
        with pytest.raises(SessionGone), queue.turn(on_wait=gone, poll_s=0.01):
            order.append("the gone session ran")

    def next_in_line():
        with queue.turn(poll_s=0.01):
            order.append("next in line runs")

    threads = [threading.Thread(target=job) for job in (holder, leaver, next_in_line)]
    for thread in threads:
        thread.start()
        time.sleep(0.1)
    assert queue.num_waiting == 1  # only the one behind the holder is still waiting
    release.set()
    for thread in threads:
        thread.join(5)
    assert order == ["holder runs", "next in line runs"]
