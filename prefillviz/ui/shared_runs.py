"""Identical runs measured once: a class pressing "Run" on the same preset gets one measurement.

While a run is queued or running, or finished less than ``SHARE_TTL_S`` ago, a request whose
inputs are identical joins it and gets the same result: the key holds everything a result
depends on (the page or lesson step, model id, device, dtype, the prompt, the engine settings,
the capture level), so runs whose inputs differ never share. The prompt is in the key, so a
session only ever joins a run of the very prompt it sent: no one sees another's text.

The first session to ask runs it (the owner, in its turn of the run queue); the others wait for
its result with their own thread, and say so. An owner that fails or goes away (Streamlit stops
its thread) abandons the entry, and each waiting session then measures for itself. Entries are
bounded in number and expire, so nothing personal stays in the server's memory for long.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from prefillviz.engine.errors import PrefillVizError

SHARE_TTL_S = 60.0  # a finished result is shared for this long, then measured anew
MAX_ENTRIES = 64
JOIN_TIMEOUT_S = 900.0  # a joiner waits at most this long for the owner's result


@dataclass
class _Entry:
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    viewers: int = 1
    finished_at: float | None = None
    abandoned: bool = False
    viewer_ids: set = field(default_factory=set)


@dataclass(frozen=True)
class Shared:
    """A result and how it was obtained: ``viewers`` sessions got this one measurement so far."""

    result: Any
    viewers: int
    joined: bool  # this session joined another's run (False: it measured)


class SharedRuns:
    """The process-wide table of runs being measured or just measured, by their inputs."""

    def __init__(self, ttl_s: float = SHARE_TTL_S, max_entries: int = MAX_ENTRIES) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self.measured = 0  # runs actually measured (owners that finished), for the load test's figures

    def _expire(self, now: float) -> None:
        for key in [k for k, e in self._entries.items()
                    if e.finished_at is not None and now - e.finished_at > self.ttl_s]:
            del self._entries[key]
        while len(self._entries) > self.max_entries:  # the oldest first; a running entry's owner still holds its object
            self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget every entry (a run in progress still hands its result to those already waiting)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            self._expire(time.monotonic())
            return len(self._entries)

    def run(self, key: Hashable, measure: Callable[[], Any], viewer: Hashable = None,
            on_join_wait: Callable[[int], None] | None = None, poll_s: float = 0.5,
            timeout_s: float = JOIN_TIMEOUT_S) -> Shared:
        """``measure()``'s result, measured once for every identical ``key`` within the sharing time.

        Args:
            key: everything the result depends on (hashable).
            measure: runs the measurement (the owner calls it; it takes its own turn in the run queue).
            viewer: who asks (a session id). A viewer that already has a finished result of ``key``
                and asks again wants a new measurement ("Run again"), and gets one.
            on_join_wait: called while a joiner waits, with the viewers so far (outside the lock).
            poll_s: how often ``on_join_wait`` is called again.
            timeout_s: how long a joiner waits before it gives up with an error.

        Raises:
            PrefillVizError: a joiner waited past ``timeout_s``; whatever ``measure`` raises, for the owner.
        """
        with self._lock:
            self._expire(time.monotonic())
            entry = self._entries.get(key)
            again = (entry is not None and entry.finished_at is not None
                     and viewer is not None and viewer in entry.viewer_ids)
            owner = entry is None or entry.abandoned or again
            if owner:
                entry = self._entries[key] = _Entry()
            else:
                entry.viewers += 1
                self._entries.move_to_end(key)
            if viewer is not None:
                entry.viewer_ids.add(viewer)
        if owner:
            return self._measure(key, entry, measure)
        deadline = time.monotonic() + timeout_s
        while not entry.done.wait(poll_s):
            if time.monotonic() > deadline:
                raise PrefillVizError(f"Waited {timeout_s:.0f} s for an identical run another session started; "
                                      "run it again.")
            if on_join_wait is not None:
                on_join_wait(entry.viewers)
        if entry.abandoned:  # its owner failed or left: measure it ourselves
            return self.run(key, measure, viewer, on_join_wait, poll_s, timeout_s)
        return Shared(entry.result, entry.viewers, joined=True)

    def _measure(self, key: Hashable, entry: _Entry, measure: Callable[[], Any]) -> Shared:
        try:
            result = measure()
        except BaseException:
            with self._lock:
                entry.abandoned = True
                if self._entries.get(key) is entry:
                    del self._entries[key]
            entry.done.set()
            raise
        with self._lock:
            entry.result, entry.finished_at = result, time.monotonic()
            self.measured += 1
        entry.done.set()
        return Shared(result, entry.viewers, joined=False)


SHARED_RUNS = SharedRuns()
"""The process-wide table in front of the run queue."""
