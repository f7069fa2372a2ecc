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
                two small matmuls (``python -m prefillviz kernels`` times both; the README has the
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
                skipped. fp32 throughout, the output in q's dtype. An fp32 step whose rows
                fill a vector turns the tile around (``csrc/attention_row_lanes.h``): the rows
                lie across the lanes, each FMA broadcasts one element of a K or V row read
                straight from the cache (no tiles to convert), and the softmax's max and sum
                over keys are plain vector ops. The engine's forward calls it directly on the
                stacked q|k|v rows (``engine/llama_forward.py``).

Which one the engine uses is measured on the machine it runs on, never assumed
(``prefillviz/engine/dispatch.py``): v7, v6, v2 and v3 are each checked against v1 there, then
timed on the model's heads for a few step shapes, and each step runs the fastest for its
shape. On a Zen 4 with AVX512-BF16 that was v7; on a Xeon with AMX, torch's SDPA (its flash
attention runs oneDNN's brgemm on the AMX tiles) beat v7 by 4x at 2,048 tokens.

``check_paged_and_time`` checks a version against v1 (fp32) and raises ``KernelCheckError``
when they differ by more than the tolerance; only then it times it and measures its memory,
with the same clocks and memory counters as ``attention.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import Callable

import torch
import torch.nn.functional as F

from kernels.attention import ORACLE_ROW_BLOCK, KernelResult, compare_to_oracle, time_checked


# ------------------------------------------------------------------------------ the step
@dataclass
class PagedStep:
    """Where each request of a step sits in the packed batch and in the cache.

    Attributes:
        query_start_loc: R + 1 offsets: request r's new tokens are rows [s[r], s[r + 1]).
        num_computed: per request, tokens already cached before this step.
        slot_mapping: (T,) cache slot of every new token (slot = block * block_size + offset).
        context_slots: per request, slots of positions 0 .. context_len - 1, or None when
            nothing was cached (the context is then exactly the new tokens).
    """

    query_start_loc: list[int]
    num_computed: list[int]
    slot_mapping: torch.Tensor
    context_slots: list[torch.Tensor | None]

    @property
    def num_requests(self) -> int:
        return len(self.num_computed)

    def query_len(self, r: int) -> int:
        return self.query_start_loc[r + 1] - self.query_start_loc[r]

    def context_len(self, r: int) -> int:
        return self.num_computed[r] + self.query_len(r)

    def slots(self, r: int) -> torch.Tensor:
        """Cache slots of request r's positions 0 .. context_len - 1."""
        slots = self.context_slots[r]
        return self.slot_mapping[self.query_start_loc[r] : self.query_start_loc[r + 1]] if slots is None else slots

    def packed_positions(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query request, query position, key request, key position): (T,), (T,), (S,), (S,).

        S = the sum of the context lengths: the keys of every request, one after another,
        in the order ``packed_slots`` gathers them.
        """
        query_lens = torch.tensor([self.query_len(r) for r in range(self.num_requests)])
        context_lens = torch.tensor([self.context_len(r) for r in range(self.num_requests)])
        requests = torch.arange(self.num_requests)
        query_request = requests.repeat_interleave(query_lens)
        key_request = requests.repeat_interleave(context_lens)
        key_position = torch.arange(int(context_lens.sum())) - (context_lens.cumsum(0) - context_lens).repeat_interleave(context_lens)
        query_position = torch.arange(len(query_request)) - (query_lens.cumsum(0) - query_lens).repeat_interleave(query_lens)
        query_position += torch.tensor(self.num_computed).repeat_interleave(query_lens)
        return tuple(t.to(device) for t in (query_request, query_position, key_request, key_position))

    def packed_slots(self) -> torch.Tensor:
        """Slots of every request's whole context, request after request: (S,)."""
        return torch.cat([self.slots(r) for r in range(self.num_requests)])


def _gather(cache_tensor: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """(n, KVH, D) rows of a (num_blocks, block_size, KVH, D) cache at ``slots``, as (KVH, n, D)."""
    return cache_tensor.view(-1, *cache_tensor.shape[2:]).index_select(0, slots).transpose(0, 1)


# ------------------------------------------------------------------------------ versions
def paged_naive(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float, row_block: int | None = None) -> torch.Tensor:
    """v1, the oracle: per request, the full (H, q, ctx) scores, masked, softmax, times V.

    ``row_block`` computes the same thing ``row_block`` query rows at a time (only the
    check uses it, so that long prompts fit in memory; the arithmetic of a row is the same).
    """
    num_heads = q.shape[0]
    outputs = []
    for r in range(step.num_requests):
        k = _gather(key_cache, step.slots(r))  # (KVH, ctx, D)
        v = _gather(value_cache, step.slots(r))
        groups = num_heads // k.shape[0]
        k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)  # (H, ctx, D)
        start, q_len, ctx = step.query_start_loc[r], step.query_len(r), step.context_len(r)
        block = row_block or q_len
        for row in range(0, q_len, block):
            rows = min(block, q_len - row)
            scores = (q[:, start + row : start + row + rows] @ k.transpose(-1, -2)) * scale  # (H, rows, ctx)
            query_position = torch.arange(rows, device=q.device)[:, None] + (ctx - q_len + row)
            future = torch.arange(ctx, device=q.device)[None, :] > query_position  # key after the query
            probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            outputs.append(probs @ v)  # (H, rows, D)
    return torch.cat(outputs, dim=1)


def paged_loop(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v2: one SDPA call per request."""
    return _per_request(q, k_new, v_new, key_cache, value_cache, step, scale, fp32_decodes=False)


def paged_loop_fp32_decodes(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v6: v2, but a 16-bit decode on a CPU is two small fp32 matmuls instead of SDPA."""
    fp32_decodes = q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
    return _per_request(q, k_new, v_new, key_cache, value_cache, step, scale, fp32_decodes)


def decode_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One query row per head over all keys: q (H, 1, D), k and v (KVH, S, D) -> (H, 1, D).

    GQA without copies: the G query heads of one KV head become G rows of one matmul.
    Scores, softmax and P V in fp32 (as SDPA accumulates), the output in q's dtype.
    """
    num_kv_heads, groups = k.shape[0], q.shape[0] // k.shape[0]
    queries = q.reshape(num_kv_heads, groups, q.shape[-1]).float()  # head h = (h // G, h % G)
    probs = torch.softmax(torch.bmm(queries, k.float().transpose(1, 2)) * scale, dim=-1)  # (KVH, G, S)
    return torch.bmm(probs, v.float()).to(q.dtype).reshape(q.shape)


def _per_request(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float, fp32_decodes: bool) -> torch.Tensor:
    enable_gqa = q.shape[0] != k_new.shape[0]
    outputs = []
    for r, num_computed in enumerate(step.num_computed):
        start, end = step.query_start_loc[r], step.query_start_loc[r + 1]
        if num_computed == 0:  # nothing cached: the context is exactly the new tokens
            k, v = k_new[:, start:end], v_new[:, start:end]
        else:
            k, v = _gather(key_cache, step.slots(r)), _gather(value_cache, step.slots(r))  # (KVH, ctx, D)
        q_len, kv_len = end - start, k.shape[1]
        if q_len == 1 and fp32_decodes:
            outputs.append(decode_fp32(q[:, start:end], k, v, scale))
            continue
        mask, is_causal = None, False
        if q_len > 1 and kv_len == q_len:
            is_causal = True
        elif q_len > 1:  # a chunk after cached context: causal, shifted by what was cached
            rows = torch.arange(q_len, device=q.device)[:, None] + (kv_len - q_len)
            mask = torch.arange(kv_len, device=q.device)[None, :] <= rows  # (q, kv) True = attend
        out = F.scaled_dot_product_attention(
            q[None, :, start:end], k[None], v[None], attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )
        outputs.append(out[0])
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


def packed_mask(step: PagedStep, device: torch.device) -> torch.Tensor:
    """(T, S) bool, True = attend: same request, and the key's position <= the query's."""
    query_request, query_position, key_request, key_position = step.packed_positions(device)
    return (query_request[:, None] == key_request[None, :]) & (key_position[None, :] <= query_position[:, None])


def _packed_keys(k_new, v_new, key_cache, value_cache, step: PagedStep) -> tuple[torch.Tensor, torch.Tensor]:
    if step.num_requests == 1 and step.num_computed[0] == 0:
        return k_new, v_new
    slots = step.packed_slots()
    return _gather(key_cache, slots), _gather(value_cache, slots)  # (KVH, S, D)


def paged_packed(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v3: one gather, one SDPA call, a block-diagonal causal mask."""
    k, v = _packed_keys(k_new, v_new, key_cache, value_cache, step)
    fresh_prompt = step.num_requests == 1 and step.num_computed[0] == 0
    mask = None if fresh_prompt else packed_mask(step, q.device)  # one fresh prompt: the mask is plain causal
    out = F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=mask, is_causal=fresh_prompt and q.shape[1] > 1, scale=scale,
        enable_gqa=q.shape[0] != k.shape[0],
    )
    return out[0]


# --------------------------------------------------------------------- v4 FlexAttention
FLEX_BLOCK = 128  # FlexAttention's BlockMask tile (its default)


@cache
def _compiled_flex() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def paged_flex(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v4: v3's packing, FlexAttention with a BlockMask (tiles no request needs are skipped)."""
    from torch.nn.attention.flex_attention import create_block_mask

    k, v = _packed_keys(k_new, v_new, key_cache, value_cache, step)
    query_request, query_position, key_request, key_position = step.packed_positions(q.device)

    def same_request_causal(batch, head, query, key):
        return (query_request[query] == key_request[key]) & (key_position[key] <= query_position[query])

    num_queries, num_keys = q.shape[1], k.shape[1]
    block_mask = create_block_mask(same_request_causal, None, None, num_queries, num_keys, device=q.device, BLOCK_SIZE=FLEX_BLOCK)
    out = _compiled_flex()(q[None], k[None], v[None], block_mask=block_mask, scale=scale, enable_gqa=q.shape[0] != k.shape[0])
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
    except Exception as error:  # noqa: BLE001: any failure means "does not run here", with its reason
        return False, f"compiled FlexAttention does not run on {device} (torch {torch.__version__}): {type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
    return True, f"compiled FlexAttention runs on {device} (torch {torch.__version__})"


# --------------------------------------------------------------------- v5 Triton
def paged_triton(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v5: the Triton paged-prefill kernel, through block tables built from the step's slots."""
    from kernels import paged_attention_triton as triton_kernel

    block_tables, context_lens = triton_kernel.block_tables_from_slots(
        [step.slots(r) for r in range(step.num_requests)], key_cache.shape[1]
    )
    query_start_loc = torch.tensor(step.query_start_loc, dtype=torch.int32, device=q.device)
    return triton_kernel.paged_prefill_attention(
        q, key_cache, value_cache, block_tables.to(q.device), context_lens.to(q.device), query_start_loc, scale
    )


def triton_status(device: str | torch.device) -> tuple[bool, str]:
    """Whether v5 can run on ``device``: CUDA with Triton, or a CPU with TRITON_INTERPRET=1."""
    try:
        from kernels import paged_attention_triton as triton_kernel
    except ImportError as error:
        return False, f"the Triton kernel does not import: {error}"
    return triton_kernel.available(device)


# ------------------------------------------------------------------------------ registry
@dataclass(frozen=True)
class PagedKernel:
    """One version: its name, what it changes, the function, and whether it can run on a device."""

    name: str
    version: int
    changes: str
    forward: Callable[..., torch.Tensor]
    status: Callable[[str], tuple[bool, str]] = lambda device: (True, "plain torch")

    def __call__(self, q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
        return self.forward(q, k_new, v_new, key_cache, value_cache, step, scale)


NAIVE = PagedKernel("v1 naive", 1, "the oracle: per request, gather, (H, q, ctx) scores, mask, softmax, times V", paged_naive)
LOOP = PagedKernel("v2 loop", 2, "one torch SDPA call per request (is_causal, offset mask, or none)", paged_loop)
PACKED = PagedKernel("v3 packed", 3, "all requests in one SDPA call with a block-diagonal causal mask", paged_packed)
FLEX = PagedKernel(
    "v4 flex", 4, "v3's packing in compiled FlexAttention: a BlockMask skips tiles no request needs", paged_flex,
    lambda device: flex_status(str(torch.device(device).type)),
)
TRITON = PagedKernel(
    "v5 triton", 5, "a Triton kernel: one program per (query block, head, request) walking the block table", paged_triton,
    triton_status,
)
LOOP_FP32_DECODES = PagedKernel(
    "v6 loop, fp32 decodes", 6,
    "v2, but a 16-bit decode on a CPU is two fp32 matmuls (torch's bf16 SDPA is slow for one query row there)",
    paged_loop_fp32_decodes,
)


# --------------------------------------------------------------------- v7 compiled, CPU
def paged_compiled(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float) -> torch.Tensor:
    """v7: the engine's C++ kernel (``csrc/engine_ops.cpp``), reading every key from the cache through the slots."""
    from kernels import engine_ops

    num_heads, num_tokens, head_dim = q.shape
    rows = q.transpose(0, 1).reshape(num_tokens, num_heads * head_dim)
    out = engine_ops.paged_attention(engine_ops.engine_ops(), rows, key_cache, value_cache, step, num_heads, scale)
    return out.view(num_tokens, num_heads, head_dim).transpose(0, 1)


def compiled_status(device: str | torch.device) -> tuple[bool, str]:
    """Whether v7 runs on ``device``: a CPU where the engine's C++ ops are built and pass their check."""
    from kernels import engine_ops

    if torch.device(device).type != "cpu":
        return False, "the engine's C++ ops are a CPU path"
    ops, why = engine_ops.engine_ops_status()
    return ops is not None, why


COMPILED = PagedKernel(
    "v7 compiled", 7,
    "FlashAttention's tiling in C++ on a CPU: per (request, KV head, 16 query tokens), fp32 key tiles, online softmax, no gather",
    paged_compiled, compiled_status,
)
PAGED_KERNELS: tuple[PagedKernel, ...] = (NAIVE, LOOP, PACKED, FLEX, TRITON, LOOP_FP32_DECODES, COMPILED)


def get_paged_kernel(name: str) -> PagedKernel:
    """The kernel called ``name`` (e.g. ``"v3 packed"``)."""
    for kernel in PAGED_KERNELS:
        if kernel.name == name:
            return kernel
    raise KeyError(f"No paged attention kernel named {name!r}; there are {', '.join(k.name for k in PAGED_KERNELS)}.")


# ------------------------------------------------------------------------------ inputs
@dataclass
class PagedInputs:
    """A step's q, new K/V, a filled paged cache and the step's metadata, ready to call a kernel with."""

    workload: str
    q: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    step: PagedStep
    scale: float

    def arguments(self) -> tuple:
        return self.q, self.k_new, self.v_new, self.key_cache, self.value_cache, self.step, self.scale

    @property
    def num_context_tokens(self) -> int:
        return sum(self.step.context_len(r) for r in range(self.step.num_requests))


def random_step(
    requests: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    workload: str = "",
) -> PagedInputs:
    """Random q/k/v for a step of ``requests`` = [(num_computed, num_new), ...].

    Each request gets its own blocks, handed out in a shuffled order (as a block pool that
    has served other requests would), its cached context and new K/V written to the cache.
    """
    generator = torch.Generator().manual_seed(seed)
    blocks_per_request = [math.ceil((cached + new) / block_size) for cached, new in requests]
    physical = torch.randperm(sum(blocks_per_request), generator=generator)
    key_cache = torch.zeros(len(physical), block_size, num_kv_heads, head_dim)
    value_cache = torch.zeros_like(key_cache)
    query_start_loc, num_computed, new_slots, context_slots, first_block = [0], [], [], [], 0
    for (cached, new), num_blocks in zip(requests, blocks_per_request):
        table = physical[first_block : first_block + num_blocks]
        first_block += num_blocks
        positions = torch.arange(cached + new)
        slots = table[positions // block_size] * block_size + positions % block_size
        keys = torch.randn(cached + new, num_kv_heads, head_dim, generator=generator)
        values = torch.randn(cached + new, num_kv_heads, head_dim, generator=generator)
        key_cache.view(-1, num_kv_heads, head_dim)[slots] = keys
        value_cache.view(-1, num_kv_heads, head_dim)[slots] = values
        new_slots.append(slots[cached:])
        context_slots.append(slots if cached else None)
        num_computed.append(cached)
        query_start_loc.append(query_start_loc[-1] + new)
    slot_mapping = torch.cat(new_slots)
    k_new = key_cache.view(-1, num_kv_heads, head_dim)[slot_mapping].transpose(0, 1)
    v_new = value_cache.view(-1, num_kv_heads, head_dim)[slot_mapping].transpose(0, 1)
    q = torch.randn(num_heads, query_start_loc[-1], head_dim, generator=generator)

    def put(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(device=device, dtype=dtype).contiguous()

    step = PagedStep(query_start_loc, num_computed, slot_mapping.to(device), [None if s is None else s.to(device) for s in context_slots])
    return PagedInputs(workload, put(q), put(k_new), put(v_new), put(key_cache), put(value_cache), step, head_dim**-0.5)


# ------------------------------------------------------------------------------ check + time
@torch.inference_mode()
def check_paged(kernel: PagedKernel, inputs: PagedInputs, tolerance: float | None = None) -> tuple[float, float]:
    """``kernel`` against the fp32 v1 oracle on the same step.

    Returns:
        (max |kernel - oracle|, the allowed difference).

    Raises:
        KernelCheckError: a wrong shape, non-finite values, or a difference above the allowed one.
    """
    fp32 = [t.float() if isinstance(t, torch.Tensor) else t for t in inputs.arguments()]
    expected = paged_naive(*fp32, row_block=ORACLE_ROW_BLOCK)
    where = f"the {inputs.workload or 'given'} step"
    return compare_to_oracle(kernel.name, kernel(*inputs.arguments()), expected, inputs.v_new, tolerance, where)


def check_paged_and_time(
    kernel: PagedKernel, inputs: PagedInputs, runs: int = 5, warmup: int = 2, measure_memory: bool = True
) -> KernelResult:
    """Check ``kernel`` against v1, then time it, then measure its memory (see ``attention.check_and_time``)."""
    check = check_paged(kernel, inputs)
    return time_checked(
        kernel.name, kernel.version, lambda: kernel(*inputs.arguments()), inputs.q, inputs.k_new.shape[0], check, runs, warmup,
        measure_memory, workload=inputs.workload, context_tokens=inputs.num_context_tokens,
    )

