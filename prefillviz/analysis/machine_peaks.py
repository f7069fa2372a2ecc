"""A device's measured peaks (matmul GFLOP/s, memory GB/s) as data: what the roofline and the
predictions read. ``prefillviz/measure/peaks.py`` measures them and keeps their history."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from prefillviz.machine.load import BUSY_PERCENT


@dataclass
class MachinePeaks:
    """Measured peaks of one device in one dtype: one measurement, or the best of a history.

    Attributes:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        matmul_gflops: best median matmul throughput, GFLOP/s.
        memory_gb_s: best median memory bandwidth (max of gemv and copy), GB/s (1e9 bytes).
        measured_at: ISO 8601 time of the measurement (of a history: of its best matmul figure).
        machine: CPU model name or GPU name.
        num_threads: torch intra-op threads used (CPU parallelism).
        gemv_gb_s: bandwidth of the decode-shaped weight read alone.
        copy_gb_s: bandwidth of the tensor copy alone (bytes read + written).
        other_cpu_percent: other processes' share of all cores during the measurement (of a
            history: the larger of the two measurements the best figures come from); None
            when it was not recorded.
        num_measurements: how many measurements the figures are the best of.
        matmul_gflops_min: the lowest matmul figure among them.
        memory_gb_s_min: the lowest memory figure among them.
        oldest_measured_at: ISO 8601 time of the first of them.
        newest_measured_at: ISO 8601 time of the last of them.

    The history fields default to a history of one, so peaks built from a single
    measurement (older data, tests) read the same as a one-entry cache.
    """

    device: str
    dtype: str
    matmul_gflops: float
    memory_gb_s: float
    measured_at: str
    machine: str
    num_threads: int
    gemv_gb_s: float = 0.0
    copy_gb_s: float = 0.0
    other_cpu_percent: float | None = None
    num_measurements: int = 1
    matmul_gflops_min: float | None = None
    memory_gb_s_min: float | None = None
    oldest_measured_at: str | None = None
    newest_measured_at: str | None = None

    def __post_init__(self) -> None:
        if self.matmul_gflops_min is None:
            self.matmul_gflops_min = self.matmul_gflops
        if self.memory_gb_s_min is None:
            self.memory_gb_s_min = self.memory_gb_s
        if self.oldest_measured_at is None:
            self.oldest_measured_at = self.measured_at
        if self.newest_measured_at is None:
            self.newest_measured_at = self.measured_at

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte where the roofline turns from memory- to compute-bound."""
        return self.matmul_gflops / self.memory_gb_s

    @property
    def busy(self) -> bool:
        """Whether other processes used more than ``BUSY_PERCENT`` of the cores meanwhile."""
        return self.other_cpu_percent is not None and self.other_cpu_percent > BUSY_PERCENT

    def history_label(self) -> str:
        """One line for a caption: how many measurements, when, their spread, and the load."""
        if self.num_measurements == 1:
            history = f"Peaks: 1 measurement, {_short_time(self.measured_at)}."
        else:
            history = (
                f"Peaks: the best of {self.num_measurements} measurements ({_short_time(self.oldest_measured_at)} to "
                f"{_short_time(self.newest_measured_at)}; "
                f"matmul {self.matmul_gflops_min:,.0f}–{self.matmul_gflops:,.0f} GFLOP/s, "
                f"memory {self.memory_gb_s_min:,.1f}–{self.memory_gb_s:,.1f} GB/s). "
                f"The best matmul figure is from {_short_time(self.measured_at)}."
            )
        if self.other_cpu_percent is None:
            return f"{history} The machine's load was not recorded."
        load = f"other processes used {self.other_cpu_percent:.0f}% of the cores while the best figures were measured"
        if self.busy:
            return f"{history} Busy: {load}, so this machine can likely do more; measure again when it is quiet."
        return f"{history} Quiet: {load}."


def _short_time(iso_time: str | None) -> str:
    """``2025-01-08T14:03:11+00:00`` -> ``2025-01-08 14:03 UTC`` (anything else unchanged)."""
    parsed = parse_time(iso_time)
    if parsed is None:
        return str(iso_time)
    return parsed.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def parse_time(iso_time: str | None) -> datetime.datetime | None:
    """A measurement's ISO 8601 time, UTC when it names no zone; None when it can't be read."""
    try:
        parsed = datetime.datetime.fromisoformat(str(iso_time))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)
