"""How fast a 16-bit dtype runs here next to float32, measured with the engine's own linear path.

``devices.check_dtype`` says whether a dtype runs at all; this says whether it is slow, so the
sidebar and the command line can say "runs, but 3x slower" with a measured factor instead of a
guess from the CPU's name (bf16 on a CPU without native support, fp16 on most CPUs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefillviz.backends.packed_weights import pack_weight, packed_linear, packing_available
from prefillviz.machine.devices import dtype_name
from prefillviz.machine.timers import time_call

SLOW_FACTOR = 1.25  # a dtype this much slower than float32 here is called slow
_SPEED_WINDOW_S = 0.005  # each timed run repeats the ops until it lasts this long
_SPEED_RUNS = 3


@dataclass(frozen=True)
class DtypeSpeed:
    """How fast a dtype runs here next to float32, measured on a prefill-shaped layer slice.

    Attributes:
        device, dtype: what was measured.
        slowdown_vs_float32: seconds in ``dtype`` over seconds in float32 (1.0 for float32;
            below 1 means faster). Measured: a 128-token linear of the bundled model's MLP
            width through the engine's linear path (packed where it packs) plus causal SDPA.
        what: what was timed, for the caption.
    """

    device: str
    dtype: str
    slowdown_vs_float32: float
    what: str

    @property
    def slow(self) -> bool:
        return self.slowdown_vs_float32 > SLOW_FACTOR

    def note(self) -> str:
        """A sentence for the sidebar and the command line ('' when the dtype is not slow here)."""
        if not self.slow:
            return ""
        return (
            f"{self.dtype} runs {self.slowdown_vs_float32:.1f}x slower than float32 on this {self.device} "
            f"(measured: {self.what}); this CPU has no fast path for it. float32 is faster here."
        )


@functools.cache
def _layer_slice_s(device: torch.device, dtype: torch.dtype) -> float:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(128, 576, generator=generator).to(device=device, dtype=dtype)  # (T, D)
    weight = torch.randn(1536, 576, generator=generator).to(device=device, dtype=dtype)  # (out, in)
    q = torch.randn(1, 9, 128, 64, generator=generator).to(device=device, dtype=dtype)  # (B, H, T, d)
    if packing_available(device, dtype)[0]:
        packed = pack_weight(weight)
        linear = lambda: packed_linear(x, packed)  # noqa: E731
    else:
        linear = lambda: F.linear(x, weight)  # noqa: E731

    def layer_slice() -> None:
        with torch.inference_mode():
            linear()
            F.scaled_dot_product_attention(q, q, q, is_causal=True)

    return time_call(layer_slice, device, runs=_SPEED_RUNS, warmup=1, min_run_time_s=_SPEED_WINDOW_S).median_s


@functools.cache
def dtype_speed(device: torch.device | str, dtype: torch.dtype) -> DtypeSpeed:
    """Measures ``dtype`` against float32 here (a few tenths of a second; once per process and dtype).

    Call it only for a dtype that ``check_dtype`` says runs.
    """
    device = torch.device(device)
    what = "a 128-token 576x1536 linear plus causal attention, median of 3 timed runs each"
    if dtype == torch.float32:
        return DtypeSpeed(str(device), "float32", 1.0, what)
    slowdown = _layer_slice_s(device, dtype) / _layer_slice_s(device, torch.float32)
    return DtypeSpeed(str(device), dtype_name(dtype), slowdown, what)
