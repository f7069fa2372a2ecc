"""RunQueue: one run at a time, first come first served, waiting runs told their place."""

import threading
import time

from prefillviz.ui.run_queue import RunQueue


def test_runs_never_overlap_and_go_in_arrival_order():
    queue = RunQueue()
    running, max_running, order, positions = [0], [0], [], {}
    lock = threading.Lock()
    everyone_waits = threading.Event()  # the first run holds its turn until the other four are queued

    def run(name):
        with queue.turn(on_wait=lambda ahead: positions.setdefault(name, ahead), poll_s=0.01):
            with lock:
                running[0] += 1
                max_running[0] = max(max_running[0], running[0])
                order.append(name)
            if name == 0:
                everyone_waits.wait(timeout=10)
            time.sleep(0.05)
            with lock:
                running[0] -= 1

    # the threads' arrival, not a guessed sleep, orders them (a loaded CI machine is slow)
    def until(condition) -> None:
        deadline = time.monotonic() + 10
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.002)

    threads = []
    for i in range(5):
        threads.append(threading.Thread(target=run, args=(i,)))
        threads[-1].start()
        until(lambda: order if i == 0 else queue.num_waiting == i)  # run 0 holds the turn; run i is the i-th in line
    everyone_waits.set()
    for thread in threads:
        thread.join()
    assert max_running[0] == 1
    assert order == [0, 1, 2, 3, 4]
    assert positions == {1: 1, 2: 2, 3: 3, 4: 4}  # runs ahead when each first waited
    assert queue.num_waiting == 0


def test_a_failed_run_gives_its_turn_back():
    queue = RunQueue()
    try:
        with queue.turn():
            raise ValueError("boom")
    except ValueError:
        pass
    with queue.turn() as waited_s:
        assert waited_s < 1.0


def test_waiting_for_an_idle_queue_lets_every_run_go_first():
    queue = RunQueue()
    assert queue.wait_idle(0.0, timeout_s=1.0)  # nobody has asked
    held = threading.Event()
    release = threading.Event()

    def run():
        with queue.turn():
            held.set()
            release.wait(5)

    worker = threading.Thread(target=run)
    worker.start()
    assert held.wait(5)
    start = time.monotonic()
    assert not queue.wait_idle(0.05, timeout_s=0.2)  # a run holds the model: not idle within the timeout
    assert time.monotonic() - start >= 0.2
    release.set()
    worker.join(5)
    start = time.monotonic()
    assert queue.wait_idle(0.1, timeout_s=5.0)  # idle once the run let go and 0.1 s passed with no one asking
    assert time.monotonic() - start >= 0.09
