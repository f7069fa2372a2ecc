"""What this machine can really do: matmul throughput and memory bandwidth, measured.

The roofline needs two numbers per device and dtype, and datasheet numbers are useless on
a shared 2-core VM or a laptop, so they are measured by a short microbenchmark (gpt-fast /
nanoGPT ``bench.py`` discipline: warm up, synchronize before reading the clock, CUDA events
on GPU, several runs, median):

* ``matmul_gflops``: the best of a few prefill-shaped matmuls, (512 x 576) @ (576 x 1536)
  (a 512-token MLP projection of SmolLM2-135M) and a square 2048^3 (4096^3 and 8192^3
  added on CUDA, where small shapes can't fill the chip). On a CPU each is also timed with
  the weight pre-packed, as the engine runs its linears (``engine/packed_weights.py``).
* ``memory_gb_s``: the best of a decode-shaped weight read (one token's row times a
  256 MiB weight matrix, far larger than any cache; ``gemv_gb_s``) and a 256 MiB tensor
  copy (read + write; ``copy_gb_s``). Both are kept: when the gemv kernel itself is slow
  (bf16 on many CPUs) decode runs well under the copy bandwidth.

Results are cached as JSON per machine, device, dtype and thread count under
``$PREFILLVIZ_CACHE/peaks/`` (default ``~/.cache/prefillviz``); ``machine_peaks`` reads the
cache or measures (~3-5 s on a 2-core CPU).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from prefillviz.engine.packed_weights import pack_weight, packed_linear, packing_available
from prefillviz.instrument.timers import synchronize

MATMUL_SHAPES = ((512, 576, 1536), (2048, 2048, 2048))  # (M, K, N): (M, K) @ (K, N)
CUDA_EXTRA_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192))
BANDWIDTH_BYTES = 256 * 2**20  # larger than any CPU cache or GPU L2
GEMV_ROWS = 8192
PEAKS_FORMAT = 2  # in the cache file name; 2: packed-weight matmuls count on a CPU
MIN_RUN_TIME_S = 0.02  # repeat fast ops within one timed run until a run takes this long
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class MachinePeaks:
    """Measured peaks of one device in one dtype.

    Attributes:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        matmul_gflops: best median matmul throughput, GFLOP/s.
        memory_gb_s: best median memory bandwidth (max of gemv and copy), GB/s (1e9 bytes).
        measured_at: ISO 8601 time of the measurement.
        machine: CPU model name or GPU name.
        num_threads: torch intra-op threads used (CPU parallelism).
        gemv_gb_s: bandwidth of the decode-shaped weight read alone.
        copy_gb_s: bandwidth of the tensor copy alone (bytes read + written).
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

    @property
    def ridge_intensity(self) -> float:
        """FLOPs per byte where the roofline turns from memory- to compute-bound."""
        return self.matmul_gflops / self.memory_gb_s


def machine_name(device: str | torch.device = "cpu") -> str:
    """The GPU name for CUDA devices, else the CPU model name (``/proc/cpuinfo`` on Linux)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def _dtype_name(dtype: str | torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"Unsupported dtype {dtype!r}; use one of {', '.join(_DTYPES)}.")
    return name


def peaks_cache_path(device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32") -> Path:
    """Where the peaks of this machine + device + dtype + thread count are cached."""
    root = Path(os.environ.get("PREFILLVIZ_CACHE", "~/.cache/prefillviz")).expanduser()
    device = torch.device(device)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", machine_name(device)).strip("-").lower() or "unknown"
    device_name = str(device).replace(":", "")
    return root / "peaks" / f"{slug}_{device_name}_{_dtype_name(dtype)}_{torch.get_num_threads()}threads_v{PEAKS_FORMAT}.json"


def _elapsed_s(fn: Callable[[], None], repeats: int, device: torch.device) -> float:
    if device.type == "cuda":  # CUDA events time the GPU work, not the launches
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1000
    start_s = time.perf_counter()
    for _ in range(repeats):
        fn()
    return time.perf_counter() - start_s


def _median_time_s(fn: Callable[[], None], device: torch.device, runs: int) -> float:
    """Median seconds per call: one warm-up, then ``runs`` timed runs of enough calls."""
    synchronize(device)
    first_s = _elapsed_s(fn, 1, device)  # warm-up; also sizes the repeat count
    repeats = max(1, min(1000, math.ceil(MIN_RUN_TIME_S / max(first_s, 1e-7))))
    return statistics.median(_elapsed_s(fn, repeats, device) / repeats for _ in range(runs))


@torch.inference_mode()
def measure_matmul_gflops(device: torch.device, dtype: torch.dtype, runs: int = 5) -> float:
    """Best median GFLOP/s over ``MATMUL_SHAPES`` (+ ``CUDA_EXTRA_SHAPES`` on CUDA).

    Where the engine runs its linears with pre-packed weights (a CPU), each shape is also
    timed that way, and the faster of the two counts.
    """
    shapes = MATMUL_SHAPES + (CUDA_EXTRA_SHAPES if device.type == "cuda" else ())
    packable = packing_available(device, dtype)[0]
    best = 0.0
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device).to(dtype)
        b = torch.randn(k, n, device=device).to(dtype)
        best = max(best, 2 * m * k * n / _median_time_s(lambda: torch.mm(a, b), device, runs) / 1e9)
        if packable:
            packed = pack_weight(b.t().contiguous())  # (out, in), as nn.Linear holds it
            best = max(best, 2 * m * k * n / _median_time_s(lambda: packed_linear(a, packed), device, runs) / 1e9)
    return best


@torch.inference_mode()
def measure_bandwidth_gb_s(device: torch.device, dtype: torch.dtype, runs: int = 5) -> tuple[float, float]:
    """(gemv GB/s, copy GB/s) over a ``BANDWIDTH_BYTES`` matrix."""
    columns = BANDWIDTH_BYTES // (GEMV_ROWS * dtype.itemsize)
    weight = torch.empty(GEMV_ROWS, columns, device=device, dtype=dtype).uniform_(-1, 1)  # (out, in) like nn.Linear
    token = torch.randn(1, columns, device=device).to(dtype)  # (1, in): one decode token
    gemv_s = _median_time_s(lambda: torch.nn.functional.linear(token, weight), device, runs)
    if packing_available(device, dtype)[0]:  # the engine's decode reads packed weights on a CPU
        packed = pack_weight(weight)
        gemv_s = min(gemv_s, _median_time_s(lambda: packed_linear(token, packed), device, runs))
    target = torch.empty_like(weight)
    copy_s = _median_time_s(lambda: target.copy_(weight), device, runs)
    return weight.nbytes / gemv_s / 1e9, 2 * weight.nbytes / copy_s / 1e9


def measure_peaks(device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32", runs: int = 5) -> MachinePeaks:
    """Measures matmul throughput and memory bandwidth now (no cache).

    Args:
        device: the torch device to measure.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (or the torch dtype).
        runs: timed runs per benchmark; the median is kept.

    Returns:
        The ``MachinePeaks``.
    """
    torch_device = torch.device(device)
    dtype_name = _dtype_name(dtype)
    torch_dtype = _DTYPES[dtype_name]
    matmul_gflops = measure_matmul_gflops(torch_device, torch_dtype, runs)
    gemv_gb_s, copy_gb_s = measure_bandwidth_gb_s(torch_device, torch_dtype, runs)
    return MachinePeaks(
        device=str(torch_device),
        dtype=dtype_name,
        matmul_gflops=matmul_gflops,
        memory_gb_s=max(gemv_gb_s, copy_gb_s),
        measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        machine=machine_name(torch_device),
        num_threads=torch.get_num_threads(),
        gemv_gb_s=gemv_gb_s,
        copy_gb_s=copy_gb_s,
    )


def machine_peaks(device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32", refresh: bool = False) -> MachinePeaks:
    """The peaks of this machine: from the cache, or measured and cached.

    Args:
        device: the torch device.
        dtype: the dtype the model runs in.
        refresh: measure again even when a cached result exists.

    Returns:
        The ``MachinePeaks``. A cache that can't be read is measured over; one that can't
        be written only costs a measurement next time.
    """
    path = peaks_cache_path(device, dtype)
    if not refresh and path.is_file():
        try:
            return MachinePeaks(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            pass  # unreadable or from an older format: measure again
    peaks = measure_peaks(device, dtype)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(asdict(peaks), indent=2))
        tmp.replace(path)  # atomic: a reader never sees half a file
    except OSError:
        pass
    return peaks
