"""The engine's compiled CPU ops (``csrc/engine_ops.cpp``): built by ``make``, loaded if built, checked.

Seven ops, each one call where plain torch runs several (the C++ file says what each computes):
``rms_norm``, ``add_rms_norm``, ``silu_mul``, ``rope_write_kv``, ``brgemm_linear`` (a linear layer,
or a gated MLP's silu(x G^T) * (x U^T) in one pass, on oneDNN's brgemm micro-kernel:
``csrc/linear_brgemm.h``, packed and called by ``brgemm_linear.py``), ``brgemm_paged`` (v8, bf16 or fp32:
``csrc/attention_brgemm.h``, a step's attention over the paged cache with its matmuls on the same
micro-kernel) and ``paged_attention`` (v7 of
``paged_attention.py``'s family: FlashAttention's tiling on a CPU, over the paged cache). Its
attention has two layouts, two candidates of the measured dispatch: v7 puts the rows of a
request that has enough to fill a vector across the lanes (``csrc/attention_row_lanes.h``, fp32
arithmetic in either dtype), v7 tiles keeps every request in key tiles. In key tiles, a bf16
model on a CPU with AVX512-BF16 multiplies bf16 pairs with ``vdpbf16ps`` (q.k exact, P rounded
to bf16 before P V, as torch's bf16 SDPA rounds it, sums in fp32). The other ops round floats to
bf16 with its one instruction (``vcvtne2ps2bf16``) there instead of ATen's eight: the same bits
but for denormals, which it reads as zero. The CPU is asked at run time; elsewhere the tiles are
fp32 and the rounding is ATen's.

Nothing about the CPU is assumed. torch's own probe (``torch.backends.cpu.get_cpu_capability``:
AVX512, AVX2 or DEFAULT; ``ATEN_CPU_CAPABILITY=avx2`` lowers it, for torch and for these ops
alike) picks the compiler flags, and the build is named by that capability, the source and
the torch version, so a build made for another CPU or an older source is never loaded. Once
loaded, every op is run on small inputs and compared with plain torch
(``engine_ops_status``); where anything fails (no compiler, not built, a wrong result) the
engine runs the same forward with plain torch ops, and ``engine_ops_status`` says why.

    python -m prefillviz.backends.ops.engine_ops --build     # what `make` runs (about a minute on two cores)
    python -m prefillviz.backends.ops.engine_ops             # whether they load here, and why not

``PREFILLVIZ_NO_ENGINE_OPS=1`` turns them off (to run the suite as a machine without them would);
``PREFILLVIZ_NO_BF16_DOT=1`` keeps them but computes bf16 attention in fp32 tiles and rounds
with ATen's code, as on a CPU without AVX512-BF16 (where ``__builtin_cpu_supports("avx512bf16")`` says no, that is
the path).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

import torch

from prefillviz.backends.ops import cpp_build
from prefillviz.backends.ops.paged import PagedKernel, PagedStep, paged_naive
from prefillviz.backends.ops.paged_check import random_step
from prefillviz.engine.backend import rms_norm, silu_mul

# the .cpp includes the .h files
SOURCES = [Path(__file__).resolve().parent / "csrc" / name
           for name in ("engine_ops.cpp", "attention_row_lanes.h", "attention_brgemm.h", "antidiagonal_scores.h",
                        "linear_brgemm.h")]
FOLDER = "engine_ops"  # under build/
DISABLE_ENV = "PREFILLVIZ_NO_ENGINE_OPS"
NO_BF16_DOT_ENV = "PREFILLVIZ_NO_BF16_DOT"  # bf16 attention in fp32 tiles, as on a CPU without AVX512-BF16


def build_name(cap: str | None = None) -> str:
    """The module's name: the capability, and a digest of the sources, the flags and torch's version."""
    return cpp_build.build_name("prefillviz_engine_ops", SOURCES, cap)


def build(cap: str | None = None, verbose: bool = False) -> Path:
    """Compile the ops for ``cap`` (this CPU's by default) with torch's cpp_extension and ninja."""
    cap = cap or cpp_build.capability()
    return cpp_build.build(build_name(cap), FOLDER, SOURCES, cap, verbose=verbose)


@functools.cache
def engine_ops_status() -> tuple[object | None, str]:
    """(the loaded ops module, or None; why not). Loaded and checked once per process."""
    if os.environ.get(DISABLE_ENV, "").strip() not in ("", "0"):
        return None, f"{DISABLE_ENV} is set: plain torch ops run instead of the engine's C++ ops"
    cap = cpp_build.capability()
    try:
        ops = cpp_build.load(build_name(cap), FOLDER)
        if ops is None:
            return None, (f"the engine's C++ ops are not built for {cap} here (`make install` builds them: "
                          "python -m prefillviz.backends.ops.engine_ops --build)")
        problem = self_check(ops)
    except Exception as error:  # noqa: BLE001 -- any failure means "not here", with its reason
        return None, f"the engine's C++ ops failed to load: {cpp_build.first_line(error)}"
    if problem:
        return None, f"the engine's C++ ops gave a wrong result on this CPU ({problem}); plain torch ops run instead"
    if os.environ.get(NO_BF16_DOT_ENV, "").strip() not in ("", "0"):
        ops.set_bf16_dot_products(False)
    dots = ", AVX512-BF16 for bf16: attention's dot products and rounding" if ops.bf16_dot_products() else ""
    return ops, f"the engine's C++ ops ({cap}, {ops.vector_width()} floats a vector{dots})"


def engine_ops():
    """The loaded ops module, or None (``engine_ops_status`` says why)."""
    return engine_ops_status()[0]


def self_check(ops, dtype: torch.dtype = torch.float32) -> str:
    """Every op on small random inputs against plain torch; '' when all agree, else what differed."""

    generator = torch.Generator().manual_seed(0)
    has_dot_products = ops.bf16_dot_products()  # this CPU has AVX512-BF16 (and nothing turned them off)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            # bf16 on AVX512-BF16: its dot products and rounding instruction, and ATen's code without them
            for on in [False, True] if dtype == torch.bfloat16 and has_dot_products else [has_dot_products]:
                ops.set_bf16_dot_products(on)
                if problem := _check_ops(ops, dtype, generator):
                    return problem + (", AVX512-BF16" if on and dtype == torch.bfloat16 else "")
    finally:
        ops.set_bf16_dot_products(has_dot_products)
    return ""


def _check_ops(ops, dtype: torch.dtype, generator: torch.Generator) -> str:
    # a step of dtype per side (a reference rounds twice where an op rounds once) + two fp32 sums of 64 unit-normal
    # terms (sqrt(64) eps_fp32 x sum |terms| ~ 64)
    tolerance = 2 * torch.finfo(dtype).eps + 2 * 64**1.5 * torch.finfo(torch.float32).eps

    def close(got: torch.Tensor, want: torch.Tensor) -> bool:
        return got.shape == want.shape and bool(torch.allclose(got.float(), want.float(),
                                                               rtol=tolerance, atol=tolerance))

    x = torch.randn(5, 64, generator=generator).to(dtype)
    weight = torch.randn(64, generator=generator).to(dtype)
    if not close(ops.rms_norm(x, weight, 1e-5), rms_norm(x, weight, 1e-5)):
        return f"rms_norm, {dtype}"
    residual = torch.randn(5, 64, generator=generator).to(dtype)
    summed = residual + x
    if (not close(ops.add_rms_norm(x, residual, weight, 1e-5), rms_norm(summed, weight, 1e-5))
            or not close(residual, summed)):
        return f"add_rms_norm, {dtype}"
    over = x.clone()  # in_place: the norm written over x (the forward's), the residual added as before
    if (ops.add_rms_norm(over, summed.clone(), weight, 1e-5, True).data_ptr() != over.data_ptr()
            or not close(over, rms_norm(summed + x, weight, 1e-5))):
        return f"add_rms_norm in place, {dtype}"
    for width in (48, 64):  # the general path and the one-pass path (whole pairs of vectors)
        gate_up = torch.randn(5, 2 * width, generator=generator).to(dtype)
        if not close(ops.silu_mul(gate_up), silu_mul(gate_up)):
            return f"silu_mul, {dtype}"
    inputs = random_step([(0, 37), (40, 9), (23, 1)], 6, 2, 64, dtype=dtype, seed=1)
    q = inputs.q.transpose(0, 1).reshape(inputs.q.shape[1], -1)
    fp32 = [t.float() if isinstance(t, torch.Tensor) else t for t in inputs.arguments()]
    want = paged_naive(*fp32).transpose(0, 1).reshape(q.shape)
    for row_lanes in (True, False):  # v7, and v7 tiles
        if not close(paged_attention(ops, q, inputs.key_cache, inputs.value_cache, inputs.step, 6, inputs.scale,
                                     row_lanes=row_lanes), want):
            return f"paged_attention{'' if row_lanes else ' in key tiles'}, {dtype}"
    return ""


def step_meta(step) -> tuple[torch.Tensor, torch.Tensor]:
    """(every request's context slots, one after another; (R, 4) int64 meta) for ``paged_attention``."""
    slots = step.packed_slots().to(torch.long)
    rows, start = [], 0
    for r in range(step.num_requests):
        rows.append((step.query_start_loc[r], step.query_len(r), step.num_computed[r], start))
        start += step.context_len(r)
    return slots.contiguous(), torch.tensor(rows, dtype=torch.long).reshape(-1, 4)


def paged_attention(ops, q: torch.Tensor, key_cache, value_cache, step, num_heads: int, scale: float, meta=None,
                    row_lanes: bool = True, brgemm: bool = False) -> torch.Tensor:
    """q (T, H D) -> (T, H D): a compiled kernel over the step (``meta`` from ``step_meta``, made once per step);
    ``row_lanes``: a request whose rows fill a vector has them across the lanes (v7), else every request is in key
    tiles (v7 tiles);
    ``brgemm``: v8 instead (``csrc/attention_brgemm.h``)."""
    slots, rows = meta if meta is not None else step_meta(step)
    if brgemm:
        return ops.brgemm_paged(q, key_cache, value_cache, slots, rows, num_heads, scale)
    return ops.paged_attention(q, key_cache, value_cache, slots, rows, num_heads, scale, row_lanes)


# --------------------------------------------------------------------- v7 compiled and v7 tiles, CPU
def paged_compiled(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float, row_lanes: bool = True,
                   brgemm: bool = False) -> torch.Tensor:
    """v7: the engine's C++ kernel (``csrc/engine_ops.cpp``), reading every key from the cache through the slots
    (``brgemm``: v8, the same way)."""
    num_heads, num_tokens, head_dim = q.shape
    rows = q.transpose(0, 1).reshape(num_tokens, num_heads * head_dim)
    out = paged_attention(engine_ops(), rows, key_cache, value_cache, step, num_heads, scale, row_lanes=row_lanes,
                          brgemm=brgemm)
    return out.view(num_tokens, num_heads, head_dim).transpose(0, 1)


def paged_compiled_tiles(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v7 tiles: the same kernel with every request in key tiles, rows or no rows to fill a vector."""
    return paged_compiled(q, k_new, v_new, key_cache, value_cache, step, scale, row_lanes=False)


def compiled_status(device: str | torch.device) -> tuple[bool, str]:
    """Whether v7 runs on ``device``: a CPU where the engine's C++ ops are built and pass their check."""
    if torch.device(device).type != "cpu":
        return False, "the engine's C++ ops are a CPU path"
    ops, why = engine_ops_status()
    return ops is not None, why


COMPILED = PagedKernel(
    "v7 compiled", 7,
    "FlashAttention's tiling in C++ on a CPU: per (request, KV head, 16 or 32 query tokens), online softmax, "
    "no gather; a request whose rows fill a vector has them across the lanes, the rest in key tiles",
    paged_compiled, compiled_status,
)
COMPILED_TILES = PagedKernel(
    "v7 tiles", 7,
    "v7 with every request in key tiles: fp32 tiles, or bf16 pairs on AVX512-BF16's dot products "
    "where the CPU has them",
    paged_compiled_tiles, compiled_status,
)


# --------------------------------------------------------------------- v8 brgemm, CPU, bf16 and fp32
def paged_brgemm(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v8: the C++ op ``brgemm_paged`` (``csrc/attention_brgemm.h``: the two matmuls on oneDNN's brgemm micro-kernel,
    the softmax in fp32 between), over the whole step, reading every key from the cache through the slots as v7 does."""
    return paged_compiled(q, k_new, v_new, key_cache, value_cache, step, scale, brgemm=True)


def brgemm_status(device: str | torch.device) -> tuple[bool, str]:
    """Whether v8 can run on ``device`` in some dtype: the engine's C++ ops, and oneDNN's brgemm micro-kernel
    multiplies bf16 or fp32 on this CPU (``brgemm_problem`` says which)."""
    runs, why = compiled_status(device)
    if not runs:
        return runs, why
    problems = {dtype: brgemm_problem(dtype) for dtype in BRGEMM_DTYPES.values()}
    running = [dtype for dtype, problem in problems.items() if not problem]
    if not running:
        return False, "; ".join(problems.values())
    return True, (" and ".join(running) + " on oneDNN's brgemm micro-kernel"
                  + "".join(f" ({dtype}: {problem})" for dtype, problem in problems.items() if problem))


BRGEMM_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}  # what v8 runs, by the names its probe takes


def brgemm_why(device: str | torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """'' when v8 can run this dtype and head size here, else why not."""
    if dtype not in BRGEMM_DTYPES:
        return "v8 runs bf16 and fp32 only"
    if head_dim % 64:
        return f"v8 needs a head size that is a multiple of 64 (oneDNN's packed blocks), not {head_dim}"
    runs, why = compiled_status(device)
    return brgemm_problem(BRGEMM_DTYPES[dtype]) if runs else why


@functools.cache
def brgemm_problem(dtype: str) -> str:
    """'' when oneDNN's brgemm micro-kernel multiplies ``dtype`` ("bfloat16": also packs it, in the layout v8
    packs itself) in this process (tried once), else why not."""
    return engine_ops().brgemm_problem(dtype)


BRGEMM = PagedKernel(
    "v8 brgemm", 8,
    "bf16 or fp32: per request, Q K^T and P V on oneDNN's brgemm micro-kernel (bf16 on the AMX tiles where the CPU "
    "has them), K and V packed once per KV head for its query heads, the softmax in fp32 vectors between",
    paged_brgemm, brgemm_status, brgemm_why,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prefillviz.backends.ops.engine_ops",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="compile the ops for this CPU (what `make install` runs)")
    parser.add_argument("--capability", choices=[*cpp_build.CAPABILITY_FLAGS, "DEFAULT"],
                        help="build for these vector units instead of this CPU's")
    args = parser.parse_args(argv)
    if args.build:
        started = time.perf_counter()
        try:
            path = build(args.capability)
        except Exception as error:  # noqa: BLE001 -- the engine runs without them; say so and go on
            print(f"the engine's C++ ops did not build ({type(error).__name__}: "
                  f"{str(error).splitlines()[-1][:300] if str(error) else ''}); "
                  "the engine will run plain torch ops", file=sys.stderr)
            return 1
        print(f"built {path} in {time.perf_counter() - started:.0f} s")
    ops, why = engine_ops_status()
    print(why if ops is not None else f"not loaded: {why}")
    return 0 if ops is not None or not args.build else 1


if __name__ == "__main__":
    sys.exit(main())
