"""The cached history of this machine's peaks, and the best of it that the roofline uses.

Load only ever lowers a peak, so one figure taken while a browser or a build was running
would make the roofline predict every op too slow; the cache therefore keeps a history of
measurements (``peaks.measure_peaks``) and the roofline uses the best of it.

The cache is one JSON file per machine, device, dtype and thread count under
``$PREFILLVIZ_CACHE/peaks/`` (default ``~/.cache/prefillviz``), holding the last
``MAX_MEASUREMENTS`` measurements, each with its time and its other processes' CPU share::

    {"format": 3, "measurements": [{"matmul_gflops": ..., "memory_gb_s": ...,
                                    "measured_at": ..., "other_cpu_percent": ..., ...}, ...]}

``machine_peaks`` returns the best of them (``best_of``: the highest matmul figure and the
highest memory figure, each from whichever measurement had it) with the history's size and
spread. It measures (a few seconds) when there is no cache, and once per process when the
cached figures are stale (``is_stale``: the newest measurement is older than ``MAX_AGE``, or
the best figures were taken on a busy machine); ``refresh=True`` adds a measurement always.
A file of an older format is ignored (its name carries ``PEAKS_FORMAT``, and so does its content).
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from prefillviz.analysis.machine_peaks import MachinePeaks, parse_time
from prefillviz.machine.devices import cache_root, dtype_name, machine_slug, resolve_dtype
from prefillviz.measure.peaks import measure_peaks

# in the cache file name and content; 2: packed-weight matmuls count on a CPU; 3: a history of measurements
PEAKS_FORMAT = 3
MAX_MEASUREMENTS = 8  # the cache keeps this many recent measurements
MAX_AGE = datetime.timedelta(days=7)  # a newest measurement older than this is measured again

HISTORY_FIELDS = ("num_measurements", "matmul_gflops_min", "memory_gb_s_min", "oldest_measured_at",
                  "newest_measured_at")
"""Fields of a history summary: not stored with each measurement in the cache."""


def peaks_cache_path(device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32") -> Path:
    """Where the peaks of this machine + device + dtype + thread count are cached."""
    root = cache_root()
    device = torch.device(device)
    slug = machine_slug(device)
    device_name = str(device).replace(":", "")
    name = dtype_name(resolve_dtype(dtype, device))
    return root / "peaks" / f"{slug}_{device_name}_{name}_{torch.get_num_threads()}threads_v{PEAKS_FORMAT}.json"


def best_of(measurements: Sequence[MachinePeaks]) -> MachinePeaks:
    """The best figures of several measurements, with their count and spread.

    Load only lowers a peak, so the highest matmul figure and the highest memory figure
    count, each from whichever measurement had it (gemv and copy likewise).

    Args:
        measurements: oldest first, all of one machine, device, dtype and thread count.

    Returns:
        The ``MachinePeaks`` of the history: ``measured_at`` is the best matmul figure's,
        ``other_cpu_percent`` the larger of those of the best matmul and memory figures.
    """
    if not measurements:
        raise ValueError("best_of needs at least one measurement.")
    fastest = max(measurements, key=lambda p: p.matmul_gflops)
    widest = max(measurements, key=lambda p: p.memory_gb_s)
    newest = measurements[-1]
    loads = [p.other_cpu_percent for p in (fastest, widest) if p.other_cpu_percent is not None]
    return MachinePeaks(
        device=newest.device,
        dtype=newest.dtype,
        matmul_gflops=fastest.matmul_gflops,
        memory_gb_s=widest.memory_gb_s,
        measured_at=fastest.measured_at,
        machine=newest.machine,
        num_threads=newest.num_threads,
        gemv_gb_s=max(p.gemv_gb_s for p in measurements),
        copy_gb_s=max(p.copy_gb_s for p in measurements),
        other_cpu_percent=max(loads) if loads else None,
        num_measurements=len(measurements),
        matmul_gflops_min=min(p.matmul_gflops for p in measurements),
        memory_gb_s_min=min(p.memory_gb_s for p in measurements),
        oldest_measured_at=measurements[0].measured_at,
        newest_measured_at=newest.measured_at,
    )


def is_stale(measurements: Sequence[MachinePeaks], now: datetime.datetime | None = None) -> bool:
    """Whether the cached figures deserve one more measurement.

    True when there is none, when the newest is older than ``MAX_AGE`` (or its time can't
    be read), or when the best figures were taken on a busy machine (which is also the
    case when every measurement was).
    """
    if not measurements:
        return True
    now = now or datetime.datetime.now(datetime.UTC)
    newest_time = parse_time(measurements[-1].measured_at)
    if newest_time is None or now - newest_time > MAX_AGE:
        return True
    return best_of(measurements).busy


def read_measurements(path: Path) -> list[MachinePeaks]:
    """The measurements cached at ``path``, oldest first; [] when missing, unreadable or of another format."""
    try:
        data = json.loads(path.read_text())
        if data.get("format") != PEAKS_FORMAT:
            return []
        measurements = [MachinePeaks(**record) for record in data["measurements"]]
        if not all(p.matmul_gflops > 0 and p.memory_gb_s > 0 for p in measurements):
            return []  # a figure the roofline would divide by (or NaN): not a measurement
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []
    return measurements


def write_measurements(path: Path, measurements: Sequence[MachinePeaks]) -> None:
    """Caches the measurements (oldest first) at ``path``, atomically.

    Raises:
        OSError: the file can't be written.
    """
    records = [{k: v for k, v in asdict(p).items() if k not in HISTORY_FIELDS} for p in measurements]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"format": PEAKS_FORMAT, "measurements": records}, indent=2))
    tmp.replace(path)  # atomic: a reader never sees half a file


_checked_this_process: set[Path] = set()  # cache files already checked for staleness since start-up


def machine_peaks(device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
                  refresh: bool = False) -> MachinePeaks:
    """The peaks of this machine: the best of the cached measurements, measured once more when stale.

    The first call in a process measures when there is no usable cache or ``is_stale``
    says so; later calls read the cache, so a busy machine costs one measurement per
    start-up, not one per call. Each new measurement is added to the cache's history.

    Args:
        device: the torch device.
        dtype: the dtype the model runs in.
        refresh: add a new measurement even when the cache is fresh.

    Returns:
        The ``MachinePeaks`` of the history (``best_of``). A cache that can't be read is
        measured over; one that can't be written only costs a measurement next time.
    """
    path = peaks_cache_path(device, dtype)
    measurements = read_measurements(path)
    if refresh or not measurements or (path not in _checked_this_process and is_stale(measurements)):
        measurements = [*measurements, measure_peaks(device, dtype)][-MAX_MEASUREMENTS:]
        try:
            write_measurements(path, measurements)
        except OSError:
            pass
    _checked_this_process.add(path)
    return best_of(measurements)
