"""Check, then time, then measure the memory of a kernel of the teaching family (dense and paged):
the same clocks and memory counters for every version (``attention.check_and_time``,
``paged_attention.check_paged_and_time``: they check first, then call ``time_checked``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from prefillviz.engine.clock import synchronize
from prefillviz.machine.devices import dtype_name
from prefillviz.machine.timers import CallTiming, time_call


# ------------------------------------------------------------------------------ memory
@torch.inference_mode()
def measure_peak_memory(fn: Callable[[], object], device: torch.device) -> tuple[int | None, str]:
    """Peak bytes torch's allocator held above the starting point during one call.

    Returns:
        (bytes or None, how it was measured).
    """
    if device.type == "cuda":
        synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        del out
        return int(peak), "torch.cuda.max_memory_allocated"
    if device.type != "cpu":
        return None, f"not measured on {device.type}"
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
            out = fn()
        events = [e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"]
    except (AttributeError, RuntimeError):  # a torch without these profiler internals
        return None, "not measured (torch.profiler memory events unavailable)"
    del out
    running = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        running += event.nbytes()  # frees are negative
        peak = max(peak, running)
    return int(peak), "torch.profiler allocation events"


# ------------------------------------------------------------------------------ together
@dataclass
class KernelResult:
    """One kernel on one input: checked against the oracle, timed, its memory measured."""

    kernel: str
    version: int
    num_heads: int
    num_kv_heads: int
    num_tokens: int
    head_dim: int
    dtype: str
    device: str
    max_abs_diff: float  # vs the fp32 naive oracle
    allowed_diff: float
    timing: CallTiming  # seconds per call: median, spread, runs, clock
    peak_memory_bytes: int | None  # measured (see memory_method)
    memory_method: str
    output_bytes: int
    largest_intermediate_bytes: int | None = None  # analytic, from the shapes (None: unknown)
    workload: str = "one prompt"  # what the N tokens were (paged kernels: a step's mix of requests)
    context_tokens: int | None = None  # keys attended over, all requests together (paged kernels)


def time_checked(
    name: str,
    version: int,
    call: Callable[[], torch.Tensor],
    q: torch.Tensor,
    num_kv_heads: int,
    check: tuple[float, float],
    runs: int = 5,
    warmup: int = 2,
    measure_memory: bool = True,
    **extra,
) -> KernelResult:
    """Time ``call`` (a kernel that already passed its check, ``check`` = (difference, allowed))
    and measure its memory; the result carries q's shape, dtype and device, and ``extra`` fields."""
    timing = time_call(call, q.device, runs, warmup)
    peak, method = measure_peak_memory(call, q.device) if measure_memory else (None, "not measured")
    num_heads, num_tokens, head_dim = q.shape
    return KernelResult(
        kernel=name,
        version=version,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        num_tokens=num_tokens,
        head_dim=head_dim,
        dtype=dtype_name(q.dtype),
        device=str(q.device),
        max_abs_diff=check[0],
        allowed_diff=check[1],
        timing=timing,
        peak_memory_bytes=peak,
        memory_method=method,
        output_bytes=q.numel() * q.element_size(),
        **extra,
    )
