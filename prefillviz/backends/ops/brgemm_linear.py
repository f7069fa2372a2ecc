"""The brgemm linear: the engine's own linear layer on oneDNN's brgemm micro-kernel (``csrc/linear_brgemm.h``,
the op ``brgemm_linear`` of the engine's C++ ops), bf16 or fp32, a candidate of the measured dispatch's
linears family (``dispatch.BRGEMM_LINEAR``); and the slab linear (``dispatch.SLAB_LINEAR``), the same op on
the same packs in fp32 with the engine's own micro-kernel in oneDNN's place (AVX-512 builds), which asks for
the next slab's weights while it multiplies.

The weight is packed once here, in torch, into slabs of 64 output columns as the micro-kernel reads
them; a gated MLP's [gate; up] packs into one call that returns silu(x G^T) * (x U^T), the SiLU and
the product on the fp32 sums before the one rounding. It runs where the C++ ops are built and the
micro-kernel multiplies the dtype here (v8's probe, ``engine_ops.brgemm_problem``); ``brgemm_linear_why``
says why not elsewhere. docs/BACKENDS.md has its layout; docs/BENCHMARKS.md the figures.
"""

from __future__ import annotations

import torch

from prefillviz.backends.host_memory import huge_page_empty
from prefillviz.backends.ops.engine_ops import (
    BRGEMM_DTYPES,
    brgemm_problem,
    compiled_status,
    engine_ops,
    engine_ops_status,
)

SLAB = 64  # output columns per packed slab of a weight (csrc/linear_brgemm.h)
BRGEMM_SCOPE = "brgemm::linear"  # the profiler's name for a call of BrgemmLinear
SLAB_SCOPE = "slab::linear"  # and for one of the slab linear


def brgemm_linear_why(device: str | torch.device, dtype: torch.dtype, in_features: int) -> str:
    """'' when ``BrgemmLinear`` runs this dtype and input width here, else why not."""
    if torch.device(device).type != "cpu":
        return "the brgemm linear is a CPU path (oneDNN's brgemm micro-kernel)"
    if dtype not in BRGEMM_DTYPES:
        return "the brgemm linear runs bf16 and fp32 only"
    if dtype == torch.bfloat16 and in_features % 2:
        return f"the brgemm linear packs bf16 inputs in pairs (VNNI): an input width of {in_features} is odd"
    runs, why = compiled_status(device)
    return brgemm_problem(BRGEMM_DTYPES[dtype]) if runs else why


def slab_linear_why(device: str | torch.device, dtype: torch.dtype) -> str:
    """'' when the slab linear (the engine's fp32 micro-kernel on the brgemm linear's packs) runs here, else why not."""
    if torch.device(device).type != "cpu":
        return "the slab linear is a CPU path (the engine's AVX-512 micro-kernel)"
    if dtype != torch.float32:
        return "the slab linear runs fp32 only (bf16's linears run on oneDNN's micro-kernel: AMX where the CPU has it)"
    runs, why = compiled_status(device)
    if not runs:
        return why
    if not engine_ops().slab_kernel_built():
        return "the slab linear's micro-kernel is AVX-512 code, and this CPU's build of the engine's ops is not"
    return ""


def pack_slabs(weight: torch.Tensor) -> torch.Tensor:
    """A (N, K) weight as slabs of ``SLAB`` output columns, (slabs, K * SLAB): each slab [K, SLAB] as the
    micro-kernel reads it (bf16: VNNI, [K / 2][SLAB][2], two inputs of a column side by side), columns past N zero."""
    n, k = weight.shape
    slabs = torch.nn.functional.pad(weight.detach(), (0, 0, 0, -n % SLAB)).view(-1, SLAB, k)
    if weight.dtype == torch.bfloat16:
        return slabs.view(-1, SLAB, k // 2, 2).transpose(1, 2).reshape(slabs.shape[0], k * SLAB).contiguous()
    return slabs.transpose(1, 2).reshape(slabs.shape[0], k * SLAB).contiguous()


class BrgemmLinear:
    """``F.linear(x, weight)`` on the engine's ``brgemm_linear`` op (``csrc/linear_brgemm.h``), the weight
    packed once; with ``gated``, ``weight`` is a gated MLP's [gate; up] stacked and a call returns
    silu(x G^T) * (x U^T), the SiLU and the product on the fp32 sums before the one rounding.
    ``own``: the slab linear (fp32; ``slab_linear_why``), the engine's micro-kernel in oneDNN's place."""

    def __init__(self, weight: torch.Tensor, gated: bool = False, own: bool = False) -> None:
        self.ops = engine_ops()
        if self.ops is None:
            raise RuntimeError(f"the brgemm linear needs the engine's C++ ops: {engine_ops_status()[1]}")
        if own and (why := slab_linear_why(weight.device, weight.dtype)):
            raise RuntimeError(why)
        self.gated, self.own = gated, own
        self.scope = SLAB_SCOPE if own else BRGEMM_SCOPE
        self.in_features = weight.shape[1]
        with torch.no_grad():
            parts = weight.chunk(2) if gated else (weight,)
            self.out_features = parts[0].shape[0]
            slabs = [pack_slabs(part) for part in parts]
            # on memory of its own, marked for 2 MiB pages (host_memory.huge_page_empty says why)
            self.packed, self.huge_pages = huge_page_empty((sum(s.shape[0] for s in slabs), slabs[0].shape[1]),
                                                           weight.dtype)
            torch.cat(slabs, out=self.packed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.is_contiguous():  # the engine's forward: (T, K) rows, taken as they are
            # (no reshape, contiguous and view: a bf16 512-token prefill 1.2 ms of 90 faster, A/B in one process)
            return self.ops.brgemm_linear(x, self.packed, self.out_features, self.gated, self.own)
        rows = x.reshape(-1, self.in_features).contiguous()
        out = self.ops.brgemm_linear(rows, self.packed, self.out_features, self.gated, self.own)
        return out.view(*x.shape[:-1], self.out_features)
