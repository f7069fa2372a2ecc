"""Clocks: spans inside one forward, the time of a call repeated over timed runs, and one
call on the wall clock (``run_timed``: what a user waits for, device synchronized around it).

CUDA events on a GPU, perf_counter on a CPU.

A CPU runs the ops of a forward in order before returning, so ``perf_counter`` around a
module is its real time. A GPU queues kernels: there a span is a pair of CUDA events read
after one ``synchronize`` at the end of the step (gpt-fast's habit), so timing never adds
a sync inside the forward.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from prefillviz.engine.clock import synchronized_time

T = TypeVar("T")
MIN_RUN_TIME_S = 0.02  # a timed run repeats a fast call until it lasts this long (shorter windows are scheduler noise)


class SpanClock:
    """Collects named spans (start, stop) and resolves them to seconds at ``collect``."""

    def __init__(self, device: torch.device) -> None:
        self.use_cuda_events = device.type == "cuda"
        self.device = device
        self.name = "cuda events" if self.use_cuda_events else "perf_counter"
        self._open: dict[str, object] = {}
        self._spans: list[tuple[str, object, object]] = []

    def start(self, name: str) -> None:
        if self.use_cuda_events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._open[name] = event
        else:
            self._open[name] = time.perf_counter()

    def stop(self, name: str) -> None:
        start = self._open.pop(name, None)
        if start is None:
            return
        if self.use_cuda_events:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        else:
            end = time.perf_counter()
        self._spans.append((name, start, end))

    def collect(self) -> dict[str, float]:
        """Seconds per span name (summed if a name repeats); clears the clock."""
        if self.use_cuda_events and self._spans:
            torch.cuda.synchronize(self.device)
        seconds: dict[str, float] = {}
        for name, start, end in self._spans:
            elapsed = start.elapsed_time(end) / 1000 if self.use_cuda_events else end - start
            seconds[name] = seconds.get(name, 0.0) + elapsed
        self._spans, self._open = [], {}
        return seconds


def run_timed(fn: Callable[[], T], device: torch.device) -> tuple[float, T]:
    """One call on the wall clock, the device synchronized before and after: what a user waits.

    Returns:
        (seconds, what ``fn`` returned).
    """
    start = synchronized_time(device)
    result = fn()
    return synchronized_time(device) - start, result


def run_seconds(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    """Seconds for ``calls`` back-to-back calls: CUDA events on a GPU (the GPU work, not the launches),
    ``run_timed`` elsewhere."""

    def repeat() -> None:
        for _ in range(calls):
            fn()

    if device.type != "cuda":
        return run_timed(repeat, device)[0]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    repeat()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / 1000


def median_and_spread(values: list[float]) -> dict:
    """Repeated measurements (seconds or ratios) as a bench reports them: median, min, max, runs."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


@dataclass
class CallTiming:
    """Seconds per call over timed runs (each run repeats the call ``calls_per_run`` times)."""

    median_s: float
    min_s: float
    max_s: float
    num_runs: int
    calls_per_run: int
    clock: str


def calls_per_run(seconds_per_call: float, min_run_time_s: float = MIN_RUN_TIME_S) -> int:
    """How often a run repeats a call of ``seconds_per_call`` so that it lasts ``min_run_time_s`` (1 to 1,000)."""
    return max(1, min(1000, math.ceil(min_run_time_s / max(seconds_per_call, 1e-7))))


@torch.inference_mode()
def time_call(
    fn: Callable[[], object],
    device: torch.device,
    runs: int = 5,
    warmup: int = 2,
    min_run_time_s: float = MIN_RUN_TIME_S,
) -> CallTiming:
    """Warm up, then the median over ``runs`` timed runs of seconds per call.

    A run repeats a fast call until it lasts ``min_run_time_s`` (sized from the warm-up), so
    the clock's resolution does not dominate.
    """
    warm_s = min(run_seconds(fn, 1, device) for _ in range(max(1, warmup)))
    calls = calls_per_run(warm_s, min_run_time_s)
    per_call = [run_seconds(fn, calls, device) / calls for _ in range(max(1, runs))]
    clock = "cuda events" if device.type == "cuda" else "perf_counter"
    return CallTiming(statistics.median(per_call), min(per_call), max(per_call), len(per_call), calls, clock)
