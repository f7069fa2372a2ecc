"""The engine's one clock: host ``perf_counter`` seconds, read once the device's queued work is done (a CPU
runs a step's ops before returning; a GPU queues kernels, so the clock waits for them first)."""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work before a clock is read (a no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synchronized_time(device: torch.device) -> float:
    """``perf_counter`` once the device's queued work is done: a host clock that counts GPU work too."""
    synchronize(device)
    return time.perf_counter()
