"""One model run at a time on the shared model, first come first served.

Streamlit runs each session's script in its own thread, and the model is shared between
sessions (``st.cache_resource``). Two runs at once would interleave on the same weights and
skew each other's timings, so every run takes a ticket and waits for its turn; while it
waits it is told how many runs are ahead. Waiting blocks only that session's script
thread, never the server's event loop. A session that goes away while waiting (Streamlit
stops its thread) gives its ticket back in ``finally``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class RunQueue:
    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._tickets: list[int] = []  # head = the run that holds the model
        self._next_ticket = 0

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
        start = time.perf_counter()
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
            yield time.perf_counter() - start
        finally:
            with self._condition:
                self._tickets.remove(ticket)
                self._condition.notify_all()


RUN_QUEUE = RunQueue()
"""The process-wide queue in front of the shared model."""
