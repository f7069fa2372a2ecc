"""Clocks for spans inside one forward: CUDA events on a GPU, perf_counter on a CPU.

A CPU runs the ops of a forward in order before returning, so ``perf_counter`` around a
module is its real time. A GPU queues kernels: there a span is a pair of CUDA events read
after one ``synchronize`` at the end of the step (gpt-fast's habit), so timing never adds
a sync inside the forward.
"""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work before a clock is read (a no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
