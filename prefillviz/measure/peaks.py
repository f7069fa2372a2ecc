"""What this machine can really do: matmul throughput and memory bandwidth, measured.

The roofline needs two numbers per device and dtype, and datasheet numbers are useless on
a shared 2-core VM or a laptop, so they are measured by a short microbenchmark (gpt-fast /
nanoGPT ``bench.py`` discipline through ``instrument.timers.time_call``: warm up,
synchronize before reading the clock, CUDA events on GPU, several runs, median):

* ``matmul_gflops``: the best of a few prefill-shaped matmuls, (512 x 576) @ (576 x 1536)
  (a 512-token MLP projection of SmolLM2-135M) and a square 2048^3 (4096^3 and 8192^3
  added on CUDA, where small shapes can't fill the chip). On a CPU each is also timed with
  the weight pre-packed, as the engine runs its linears (``backends/packed_weights.py``).
* ``memory_gb_s``: the best of a decode-shaped weight read (one token's row times a
  256 MiB weight matrix, far larger than any cache; ``gemv_gb_s``) and a 256 MiB tensor
  copy (read + write; ``copy_gb_s``). Both are kept: when the gemv kernel itself is slow
  (bf16 on many CPUs) decode runs well under the copy bandwidth.

Each measurement runs inside ``MachineLoad`` (``instrument/machine_load.py``), which records
how much of the CPU other processes used meanwhile. ``measure_peaks`` measures now; the
cached history of measurements, and the best of it that the roofline uses, is
``peaks_history.py``'s.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

import torch

from prefillviz.analysis.machine_peaks import MachinePeaks
from prefillviz.backends.packed_weights import pack_weight, packed_linear, packing_available
from prefillviz.machine.devices import dtype_name, machine_name, resolve_dtype
from prefillviz.machine.load import MachineLoad
from prefillviz.machine.timers import time_call

MATMUL_SHAPES = ((512, 576, 1536), (2048, 2048, 2048))  # (M, K, N): (M, K) @ (K, N)
CUDA_EXTRA_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192))
BANDWIDTH_BYTES = 256 * 2**20  # larger than any CPU cache or GPU L2
GEMV_ROWS = 8192


def _median_time_s(fn: Callable[[], None], device: torch.device, runs: int) -> float:
    """Median seconds per call: one warm-up, then ``runs`` timed runs of enough calls."""
    return time_call(fn, device, runs, warmup=1).median_s


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


def measure_peaks(device: str | torch.device = "cpu", dtype: str | torch.dtype = "float32",
                  runs: int = 5) -> MachinePeaks:
    """Measures matmul throughput and memory bandwidth now (no cache).

    Args:
        device: the torch device to measure.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (or the torch dtype).
        runs: timed runs per benchmark; the median is kept.

    Returns:
        The ``MachinePeaks``.
    """
    torch_device = torch.device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    name = dtype_name(torch_dtype)
    measured_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with MachineLoad() as load:
        matmul_gflops = measure_matmul_gflops(torch_device, torch_dtype, runs)
        gemv_gb_s, copy_gb_s = measure_bandwidth_gb_s(torch_device, torch_dtype, runs)
    return MachinePeaks(
        device=str(torch_device),
        dtype=name,
        matmul_gflops=matmul_gflops,
        memory_gb_s=max(gemv_gb_s, copy_gb_s),
        measured_at=measured_at,
        machine=machine_name(torch_device),
        num_threads=torch.get_num_threads(),
        gemv_gb_s=gemv_gb_s,
        copy_gb_s=copy_gb_s,
        other_cpu_percent=load.reading.other_cpu_percent,
    )
