"""How busy the machine was while something was measured, from the OS's CPU counters (psutil).

A slow number on a shared 2-core VM or a laptop is often someone else's fault: a browser, a
build, another user's run. ``MachineLoad`` reads the system-wide busy CPU time and this
process's own CPU time before and after a measurement; the difference is the CPU that
*other* processes used meanwhile, as a share of all the machine's cores. Shown next to a
time, it explains a slow figure instead of hiding it.

    with MachineLoad() as load:
        run_the_measurement()
    load.reading.other_cpu_percent   # 0-100: other processes' share of all cores during the block
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import psutil

BUSY_PERCENT = 25.0  # other processes using more than this share of the cores: "busy"


def _system_busy_s() -> float:
    times = psutil.cpu_times()
    return (
        sum(times) - times.idle - getattr(times, "iowait", 0.0) - getattr(times, "guest", 0.0)
        - getattr(times, "guest_nice", 0.0)
    )


def _own_cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


@dataclass
class LoadReading:
    """What the machine did during one measurement.

    Attributes:
        wall_s: seconds the measurement took.
        num_cpus: logical CPUs of the machine.
        own_cpu_percent: this process's CPU time, as a share of all cores (0-100).
        other_cpu_percent: every other process's CPU time, as a share of all cores (0-100).
    """

    wall_s: float
    num_cpus: int
    own_cpu_percent: float
    other_cpu_percent: float

    @property
    def busy(self) -> bool:
        return self.other_cpu_percent > BUSY_PERCENT

    def label(self) -> str:
        """One line for a caption: how much of the machine others used meanwhile."""
        verdict = "busy: times may be slower than this machine can do" if self.busy else "quiet"
        return f"other processes used {self.other_cpu_percent:.0f}% of the {self.num_cpus} cores meanwhile ({verdict})"

    def as_dict(self) -> dict:
        return {**asdict(self), "busy": self.busy}


class MachineLoad:
    """Context manager that measures the other processes' CPU use during its block (``.reading``)."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self.reading: LoadReading | None = None

    def __enter__(self) -> MachineLoad:
        self._start = (time.perf_counter(), _system_busy_s(), _own_cpu_s(self._process))
        return self

    def __exit__(self, *exc_info) -> None:
        wall_start, busy_start, own_start = self._start
        wall_s = max(time.perf_counter() - wall_start, 1e-9)
        num_cpus = psutil.cpu_count() or 1
        capacity_s = wall_s * num_cpus
        own_s = max(0.0, _own_cpu_s(self._process) - own_start)
        other_s = max(0.0, _system_busy_s() - busy_start - own_s)
        self.reading = LoadReading(
            wall_s=wall_s,
            num_cpus=num_cpus,
            own_cpu_percent=min(100.0, 100 * own_s / capacity_s),
            other_cpu_percent=min(100.0, 100 * other_s / capacity_s),
        )

    @property
    def elapsed_s(self) -> float:
        """Seconds since the block began (while it runs)."""
        return time.perf_counter() - self._start[0]
