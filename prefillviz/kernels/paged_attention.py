"""Attention of one engine step over a paged KV cache, several ways (llm.c ``dev/cuda`` style).

One engine step packs several requests into one batch: fresh prompts, chunks of prompts
whose first tokens are already cached, and decodes (one new token each). Every version has
one signature:

    out = kernel(q, k_new, v_new, key_cache, value_cache, step, scale)
        q             (H, T, D)   post-RoPE queries of the step's T new tokens, all requests packed
        k_new, v_new  (KVH, T, D) the step's new keys and values (already written to the cache)
        key_cache,    (num_blocks, block_size, KVH, D) one layer's paged K and V
        value_cache
        step          PagedStep: where each request's rows start, what it had cached, and
                      the cache slots of its whole context
        out           (H, T, D)   query i of request r (position num_computed[r] + i) attends
                      the request's keys 0 .. num_computed[r] + i and nothing of the others

Versions (each says what it changes from the one before):

    v1 naive    The oracle. Per request: gather its context from the cache through its
                slots, repeat K/V up to H heads, build the (H, q, ctx) scores, mask keys
                after each query's position, softmax, times V.
    v2 loop     What the engine ran first: per request, one torch SDPA call (is_causal for
                a fresh prompt, which reads the new K/V directly; an offset causal mask for a
                chunk after cached context; no mask for a decode). One call per request.
    v3 packed   All requests in ONE SDPA call: one gather of every request's context, and a
                (T, S) block-diagonal causal mask (query row r may see key column c only if
                both belong to the same request and c's position <= the row's). Fewer calls,
                but the mask and the scores span requests that never see each other.
    v4 flex     v3's packing with FlexAttention (torch.nn.attention.flex_attention) and a
                BlockMask built from the same rule: tiles where no request sees another are
                skipped instead of masked. Only compiled FlexAttention is fused; on a CPU
                the compile needs a C++ compiler and takes ~20 s per new shape
                (``flex_status`` probes whether it runs here, once).
    v5 triton   A Triton paged-prefill kernel (``paged_attention_triton.py``): one program
                per (query block, head, request) that walks the request's block table. Runs on
                CUDA; on a CPU only under TRITON_INTERPRET=1, as a correctness check.
    v6 loop, fp32 decodes
                v2 with one change, found by measuring v1 against v2: on a CPU, torch's
                bf16/fp16 SDPA is several times slower for a single query row (a decode) than
                two small matmuls (``python -m prefillviz kernels`` times both; docs/BENCHMARKS.md has the
                figures). A 16-bit decode on a
                CPU is therefore computed by ``decode_fp32``: the G query heads of a KV head
                as G rows of one matmul, with scores, softmax and P V in fp32. Prompts and
                chunks, fp32 and every GPU run use v2's SDPA calls.
    v7 compiled The engine's own kernel on a CPU (``csrc/engine_ops.cpp``, built by ``make``;
                ``engine_ops.py`` loads and checks it): FlashAttention's tiling. One task per
                (request, KV head, 16 query tokens) holds the G query heads of each token as
                rows; it walks the request's keys in tiles of 32 (AVX-512; 16 with AVX2) read
                through the slots and converted to fp32, with an online softmax, so no (q, ctx)
                score matrix, no gather and no mask exist; tiles after a row's position are
                skipped. fp32 throughout, the output in q's dtype. A request whose rows
                fill a vector turns the tile around (``csrc/attention_row_lanes.h``): the rows
                lie across the lanes, each FMA broadcasts one element of a K or V row read
                from the cache (in fp32 as it lies; a bf16 tile's rows made fp32 once per
                task), and the softmax's max and sum over keys are plain vector ops. The
                engine's forward calls it directly on the stacked q|k|v rows
                (``engine/forward.py``, through the measured backend).
    v7 tiles    v7 with every request in key tiles, the layout v7 had before the rows went
                across the lanes: fp32 tiles, or for a bf16 model on a CPU with AVX512-BF16
                bf16 pairs and its dot product (vdpbf16ps: q.k exact, P rounded to bf16).
                Which layout is faster depends on the CPU, so both are candidates.
    v8 brgemm   bf16 or fp32 (``csrc/attention_brgemm.h``): per request, Q K^T and P V on
                oneDNN's brgemm micro-kernel through ATen's cpublas (bf16 on the AMX tiles where
                the CPU has them), with K and V packed by v8 into its layout (VNNI in bf16, checked
                against oneDNN's own pack) once per KV head and shared by that head's query heads;
                the online softmax between the two in fp32 vectors (exp as 2^x: a floor and a
                polynomial fit, degree 4 for bf16, degree 5 for fp32), P rounded to bf16 before P V
                in bf16 as in torch's bf16 SDPA. Where oneDNN can't run a dtype, v8 is out for it, with why.

Which one the engine uses is measured on the machine it runs on, never assumed
(``prefillviz/backends/dispatch.py``): v7, v7 tiles, v8, v6, v2 and v3 are each checked against v1
there, then timed on the model's heads for a few step shapes, and each step runs the fastest
for its shape. On a Zen 4 with AVX512-BF16 that was v7 (then in key tiles only); on a Xeon
with AMX, torch's SDPA (its flash attention calls oneDNN's bf16 gemm per block) beat v7 by
4x at 2,048 tokens.

``check_paged_and_time`` checks a version against v1 (fp32) and raises ``KernelCheckError``
when they differ by more than the tolerance; only then it times it and measures its memory,
with the same clocks and memory counters as ``attention.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch

# ------------------------------------------------------------------------------ the step
from prefillviz.backends.ops.engine_ops import (
    BRGEMM,
    COMPILED,
    COMPILED_TILES,
    compiled_status,
    paged_brgemm,
    paged_compiled,
    paged_compiled_tiles,
)
from prefillviz.backends.ops.paged import (
    LOOP,
    LOOP_FP32_DECODES,
    NAIVE,
    PACKED,
    PagedKernel,
    PagedStep,
    decode_fp32,
    packed_keys,
    packed_mask,
    packed_positions,
    paged_loop,
    paged_loop_fp32_decodes,
    paged_naive,
    paged_packed,
)
from prefillviz.backends.ops.paged_check import PagedInputs, check_paged, random_step
from prefillviz.kernels.harness import KernelResult, time_checked

__all__ = [  # the engine's versions, with the teaching ones, as the Kernel timings page lists them
    "BRGEMM", "COMPILED", "COMPILED_TILES", "FLEX", "LOOP", "LOOP_FP32_DECODES", "NAIVE", "PACKED", "PAGED_KERNELS",
    "TRITON", "PagedInputs", "PagedKernel", "PagedStep", "check_paged", "check_paged_and_time", "compiled_status",
    "decode_fp32", "flex_status", "get_paged_kernel", "packed_keys", "packed_mask", "paged_brgemm", "paged_compiled",
    "paged_compiled_tiles", "paged_flex", "paged_loop", "paged_loop_fp32_decodes", "paged_naive", "paged_packed",
    "paged_triton", "random_step", "triton_status",
]


# --------------------------------------------------------------------- v4 FlexAttention
FLEX_BLOCK = 128  # FlexAttention's BlockMask tile (its default)


@cache
def _compiled_flex() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def paged_flex(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v4: v3's packing, FlexAttention with a BlockMask (tiles no request needs are skipped)."""
    from torch.nn.attention.flex_attention import create_block_mask

    k, v = packed_keys(k_new, v_new, key_cache, value_cache, step)
    query_request, query_position, key_request, key_position = packed_positions(step, q.device)

    def same_request_causal(batch, head, query, key):
        # the causal test first: with the two terms the other way round, torch 2.13's compiled
        # FlexAttention on an AVX-512 CPU (the AMX Xeon) let each query see key 0 only (rows of
        # zeros past it; eager flex_attention was right, and so was this order): the status probe
        # below compares with the oracle on every machine
        return (key_position[key] <= query_position[query]) & (query_request[query] == key_request[key])

    num_queries, num_keys = q.shape[1], k.shape[1]
    block_mask = create_block_mask(
        same_request_causal, None, None, num_queries, num_keys, device=q.device, BLOCK_SIZE=FLEX_BLOCK
    )
    # on CUDA, a step of fewer than 128 queries would go to inductor's flex-decoding kernel, which found no
    # valid tile for a GQA step on an H200 (torch 2.11: NoValidChoicesError); the main kernel serves any step
    options = {"FORCE_USE_FLEX_ATTENTION": True} if q.is_cuda else None
    out = _compiled_flex()(
        q[None], k[None], v[None], block_mask=block_mask, scale=scale, enable_gqa=q.shape[0] != k.shape[0],
        kernel_options=options,
    )
    return out[0]


@cache
def flex_status(device: str = "cpu") -> tuple[bool, str]:
    """Whether compiled FlexAttention runs here (probed once per device, on a tiny input).

    Returns:
        (runs, what happened): e.g. (True, "compiled FlexAttention runs on cpu (torch 2.13.0)")
        or (False, the error's first line).
    """
    try:
        generator = torch.Generator().manual_seed(0)
        q = torch.randn(2, 16, 16, generator=generator).to(device)
        k = torch.randn(1, 16, 16, generator=generator).to(device)
        step = PagedStep([0, 16], [0], torch.arange(16, device=device), [None])
        cache_tensor = k.transpose(0, 1).reshape(1, 16, 1, 16)
        got = paged_flex(q, k, k, cache_tensor, cache_tensor, step, 0.25)
        want = paged_naive(q, k, k, cache_tensor, cache_tensor, step, 0.25)
        difference = float((got - want).abs().max())
        if not difference < 1e-4:
            return False, f"compiled FlexAttention ran on {device} but differs from the oracle by {difference:.3g}"
    except Exception as error:  # noqa: BLE001 -- any failure means "does not run here", with its reason
        return False, (
            f"compiled FlexAttention does not run on {device} (torch {torch.__version__}): {type(error).__name__}: "
            f"{str(error).splitlines()[0][:200] if str(error) else ''}"
        )
    return True, f"compiled FlexAttention runs on {device} (torch {torch.__version__})"


# --------------------------------------------------------------------- v5 Triton
def paged_triton(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v5: the Triton paged-prefill kernel, through block tables built from the step's slots.

    The block tables are built once per step (host work with device syncs, as an engine builds them
    once per step for every layer) and kept on the step, so a timed call is the kernel's launch only;
    the grid's longest query comes from the step's host-side offsets, with no sync.
    """
    from prefillviz.kernels import paged_attention_triton as triton_kernel

    key = (key_cache.shape[1], str(q.device))
    tables = getattr(step, "_triton_tables", {})
    if key not in tables:
        block_tables, context_lens = triton_kernel.block_tables_from_slots(
            [step.slots(r) for r in range(step.num_requests)], key_cache.shape[1]
        )
        query_start_loc = torch.tensor(step.query_start_loc, dtype=torch.int32, device=q.device)
        tables[key] = (block_tables.to(q.device), context_lens.to(q.device), query_start_loc)
        step._triton_tables = tables
    block_tables, context_lens, query_start_loc = tables[key]
    max_query_len = max((step.query_len(r) for r in range(step.num_requests)), default=0)
    return triton_kernel.paged_prefill_attention(
        q, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale, max_query_len=max_query_len
    )


def triton_status(device: str | torch.device) -> tuple[bool, str]:
    """Whether v5 can run on ``device``: CUDA with Triton, or a CPU with TRITON_INTERPRET=1."""
    try:
        from prefillviz.kernels import paged_attention_triton as triton_kernel
    except ImportError as error:
        return False, f"the Triton kernel does not import: {error}"
    return triton_kernel.available(device)


FLEX = PagedKernel(
    "v4 flex", 4, "v3's packing in compiled FlexAttention: a BlockMask skips tiles no request needs", paged_flex,
    lambda device: flex_status(str(torch.device(device).type)),
)
TRITON = PagedKernel(
    "v5 triton", 5, "a Triton kernel: one program per (query block, head, request) walking the block table",
    paged_triton, triton_status,
)

PAGED_KERNELS: tuple[PagedKernel, ...] = (
    NAIVE, LOOP, PACKED, FLEX, TRITON, LOOP_FP32_DECODES, COMPILED, COMPILED_TILES, BRGEMM
)


def get_paged_kernel(name: str) -> PagedKernel:
    """The kernel called ``name`` (e.g. ``"v3 packed"``)."""
    for kernel in PAGED_KERNELS:
        if kernel.name == name:
            return kernel
    raise KeyError(f"No paged attention kernel named {name!r}; there are {', '.join(k.name for k in PAGED_KERNELS)}.")


def check_paged_and_time(
    kernel: PagedKernel, inputs: PagedInputs, runs: int = 5, warmup: int = 2, measure_memory: bool = True
) -> KernelResult:
    """Check ``kernel`` against v1, then time it, then measure its memory (see ``attention.check_and_time``)."""
    check = check_paged(kernel, inputs)
    return time_checked(
        kernel.name, kernel.version, lambda: kernel(*inputs.arguments()), inputs.q, inputs.k_new.shape[0], check, runs,
        warmup, measure_memory, workload=inputs.workload, context_tokens=inputs.num_context_tokens,
    )
