"""One model run at a time on the shared model, first come first served.

Streamlit runs each session's script in its own thread, and the model is shared between
sessions (``st.cache_resource``). Two runs at once would interleave on the same weights and
skew each other's timings, so every run takes a ticket and waits for its turn; while it
waits it is told how many runs are ahead. Waiting blocks only that session's script
thread, never the server's event loop. A session that goes away while waiting (Streamlit
stops its thread) gives its ticket back in ``finally``.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class RunQueue:
    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._tickets: list[int] = []  # head = the run that holds the model
        self._next_ticket = 0
        self._held_s: deque[float] = deque(maxlen=20)  # how long the last runs held the model
        self._released = time.monotonic()  # when the last run let the model go

    def estimate_s(self, ahead: int) -> float | None:
        """Seconds until a run with ``ahead`` runs before it gets the model: ``ahead`` x the median of
        the last runs' times (None before any run finished)."""
        with self._condition:
            held = list(self._held_s)
        return ahead * statistics.median(held) if held else None

    @property
    def num_waiting(self) -> int:
        with self._condition:
            return max(0, len(self._tickets) - 1)

    @contextmanager
    def turn(self, on_wait: Callable[[int], None] | None = None, poll_s: float = 0.5) -> Iterator[float]:
        """Wait for this run's turn, then hold the model until the block ends.

        Args:
            on_wait: called while waiting with the number of runs ahead (outside the lock).
            poll_s: how often ``on_wait`` is called again.

        Yields:
            Seconds spent waiting.
        """
        start, started = time.perf_counter(), None
        with self._condition:
            ticket = self._next_ticket
            self._next_ticket += 1
            self._tickets.append(ticket)
        try:
            while True:
                with self._condition:
                    if self._tickets[0] == ticket:
                        break
                    ahead = self._tickets.index(ticket)
                if on_wait is not None:
                    on_wait(ahead)
                with self._condition:
                    if self._tickets[0] != ticket:
                        self._condition.wait(timeout=poll_s)
            started = time.perf_counter()
            yield started - start
        finally:
            with self._condition:
                if started is not None:
                    self._held_s.append(time.perf_counter() - started)
                self._tickets.remove(ticket)
                self._released = time.monotonic()
                self._condition.notify_all()

    def wait_idle(self, idle_s: float, timeout_s: float) -> bool:
        """Wait until no run has held or asked for the model for ``idle_s`` (True), or ``timeout_s`` passed (False):
        work that can wait (the first start's other step shapes) goes in between the sessions' runs."""
        deadline = time.monotonic() + timeout_s
        with self._condition:
            while True:
                now = time.monotonic()
                quiet_until = self._released + idle_s
                if not self._tickets and now >= quiet_until:
                    return True
                if now >= deadline:
                    return False
                self._condition.wait(timeout=min(deadline, max(quiet_until, now + 0.05)) - now)


RUN_QUEUE = RunQueue()
"""The process-wide queue in front of the shared model."""
