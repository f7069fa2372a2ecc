"""Paged prefill attention in Triton: one engine step's packed queries against a paged KV
cache (the kernel behind vLLM's ``prefix_prefill`` / ``context_attention_fwd``).

    out = paged_prefill_attention(q, key_cache, value_cache, block_tables, context_lens,
                                  query_start_loc, scale)
        q              (H, T, D)    the packed queries of all R requests of the step, head-major
                                    (a strided view is fine: the kernel is given its strides)
        key_cache      (num_blocks, block_size, KVH, D)   one layer's paged K, the step's new
        value_cache    (num_blocks, block_size, KVH, D)   K/V already written into it
        block_tables   (R, max_blocks) int32   request r's logical block j is physical block
                                               block_tables[r, j] (padding entries 0)
        context_lens   (R,) int32      tokens of request r in the cache after this step
        query_start_loc (R + 1,) int32 request r's queries are rows [qsl[r], qsl[r + 1]) of q
        out            (H, T, D)       same dtype as q

Request r's q_len new tokens are the LAST q_len of its context_lens[r] tokens: query i sits
at position p = context_lens[r] - q_len + i and attends keys 0..p (causal, offset by what
was cached before). One call therefore serves a fresh prompt (q_len == context), a chunk
after cached context, and a decode (q_len 1), all packed into the same step. GQA: query
head h reads KV head h // (H // KVH).

Grid: one program per (query block of BLOCK_M rows, query head, request), i.e.
``(cdiv(max_q_len, BLOCK_M), H, R)``. A program whose query block starts past its
request's q_len returns at once (requests are ragged; the grid is sized for the longest).

Each program:
    1. loads its (BLOCK_M, BLOCK_D) tile of queries (rows past q_len and columns past D
       masked to 0);
    2. loops over key blocks of BLOCK_N positions from 0 up to its last query's position
       (min(prefix + (m + 1) * BLOCK_M, context_len)); key blocks past that are never read;
    3. for every key position gathers its physical block through the block table
       (block_tables[r, pos // block_size]) and loads K and V at
       (block, pos % block_size, kv_head); BLOCK_N is therefore independent of the cache's
       block_size and any block_size works (5 as well as 16);
    4. scores = q k^T * scale (fp32 accumulation), keys beyond each query's position or
       beyond the context set to -inf;
    5. online softmax (FlashAttention, Dao et al. 2022): a running row max m (initialised to
       -1e30, a finite number, so a row whose keys are all masked so far gives exp(-inf) = 0,
       never NaN), a running row sum l, and acc = acc * exp(m_old - m_new) + p v, with p cast
       to V's dtype before the second dot;
    6. writes acc / l, cast to q's dtype, masking rows past q_len and columns past D.

Constraints: D is padded to BLOCK_D = next power of two >= max(D, 16) with masked loads and
stores; BLOCK_M and BLOCK_N are powers of two >= 16 (tl.dot's minimum on a GPU); q and the
cache must have one dtype (fp32, fp16 or bf16); H must be a multiple of KVH. Cache addresses
are computed in int64 (block id * block stride can exceed 2^31 on a large cache). fp32
inputs use ``input_precision="ieee"`` so a GPU does not silently round them to TF32.

On CPU the kernel runs only under Triton's interpreter: set ``TRITON_INTERPRET=1`` BEFORE
this module is imported (``@triton.jit`` reads it when it decorates the kernel; the decision
is fixed for the life of the process). That is a correctness check only (numpy, one program
at a time: slow, never timed). The triton 3.9 interpreter multiplies bf16 tiles as their raw
uint16 bits in tl.dot, so under the interpreter 16-bit tiles are upcast to fp32 right before
each dot (after p has been rounded to V's dtype); the compiled CUDA path dots them natively.
The module imports without triton; calling the kernel when ``available`` says no raises
RuntimeError.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the module must import without triton (CPU-only installs)
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR = "triton is not installed"
except Exception as exc:  # a broken install (e.g. a driver mismatch) is reported, not raised
    triton = None
    tl = None
    _TRITON_IMPORT_ERROR = f"triton failed to import: {type(exc).__name__}: {exc}"
else:
    _TRITON_IMPORT_ERROR = None

_CPU_REASON = "needs a CUDA GPU (or TRITON_INTERPRET=1 for a slow CPU check)"
_DOT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


if triton is not None:
    from prefillviz.kernels.paged_attention_triton_jit import _INTERPRETED, _loop_to_loaded_bound, _paged_prefill_kernel
else:
    _paged_prefill_kernel = _loop_to_loaded_bound = None
    _INTERPRETED = False


@functools.cache
def _interpreter_status() -> tuple[bool, str]:
    """Whether this triton's interpreter runs the kernel's one sensitive construct (a loop to a bound
    loaded from memory), probed once per process on a 3-step loop."""
    n, count = torch.tensor([3], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    try:
        _loop_to_loaded_bound[(1,)](n, count)
    except Exception as error:  # noqa: BLE001 -- said as the reason; the compiled CUDA path is another matter
        return False, (f"triton {triton.__version__}'s interpreter can't loop to a bound loaded from memory "
                       f"(numpy {np.__version__}: {type(error).__name__}: {error}); triton 3.9's can")
    if int(count.item()) != 3:
        return False, f"triton {triton.__version__}'s interpreter ran a 3-step loop {int(count.item())} times"
    return True, "triton interpreter"


def available(device: torch.device | str) -> tuple[bool, str]:
    """Can the kernel run on tensors of ``device``? (True, "cuda" | "triton interpreter") or
    (False, a one-line reason)."""
    if triton is None:
        return False, _TRITON_IMPORT_ERROR or "triton is not installed"
    if _INTERPRETED:  # decorated under TRITON_INTERPRET=1: numpy runs it (any device's tensors)
        return _interpreter_status()
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_available():
            return True, "cuda"
        return False, "CUDA is not available (torch.cuda.is_available() is False)"
    return False, _CPU_REASON


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def paged_prefill_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    *,
    max_query_len: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Causal attention of one step's packed queries against the paged cache (see the module
    docstring). ``max_query_len`` (the longest request's q_len) sizes the grid; when None it
    is read from ``query_start_loc`` (one device sync). ``block_m`` / ``block_n`` override the
    query / key tile sizes (powers of two >= 16)."""
    ok, reason = available(q.device)
    if not ok:
        raise RuntimeError(f"paged_prefill_attention unavailable on {q.device}: {reason}")

    if q.dim() != 3 or key_cache.dim() != 4 or value_cache.dim() != 4:
        raise ValueError(
            f"expected q (H, T, D) and caches (num_blocks, block_size, KVH, D); got q "
            f"{tuple(q.shape)}, key_cache {tuple(key_cache.shape)}, value_cache {tuple(value_cache.shape)}"
        )
    num_heads, num_tokens, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = key_cache.shape
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"value_cache {tuple(value_cache.shape)} != key_cache {tuple(key_cache.shape)}")
    if cache_dim != head_dim:
        raise ValueError(f"cache head_dim {cache_dim} != q head_dim {head_dim}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"H={num_heads} is not a multiple of KVH={num_kv_heads}")
    if q.dtype not in _DOT_DTYPES or key_cache.dtype != q.dtype or value_cache.dtype != q.dtype:
        raise ValueError(
            f"q and caches must share one dtype of {_DOT_DTYPES}; got q {q.dtype}, "
            f"key_cache {key_cache.dtype}, value_cache {value_cache.dtype}"
        )
    num_requests = context_lens.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != num_requests:
        raise ValueError(f"block_tables {tuple(block_tables.shape)} is not (R={num_requests}, max_blocks)")
    if query_start_loc.shape != (num_requests + 1,):
        raise ValueError(f"query_start_loc {tuple(query_start_loc.shape)} is not (R + 1 = {num_requests + 1},)")
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache), ("block_tables", block_tables),
                    ("context_lens", context_lens), ("query_start_loc", query_start_loc)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")

    out = torch.empty((num_heads, num_tokens, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_requests == 0:
        return out

    block_tables = block_tables.to(torch.int32)
    context_lens = context_lens.to(torch.int32).contiguous()
    query_start_loc = query_start_loc.to(torch.int32).contiguous()
    if max_query_len is None:  # one sync for both: the grid size and a bounds check on q's rows
        max_query_len, last_row = torch.stack(
            [(query_start_loc[1:] - query_start_loc[:-1]).max(), query_start_loc[-1]]
        ).tolist()
        if last_row != num_tokens:
            raise ValueError(f"query_start_loc[-1] = {last_row} but q has T = {num_tokens} rows")
    if max_query_len <= 0:
        return out

    block_d = max(16, _next_power_of_2(head_dim))
    if _INTERPRETED:  # small tiles: tiny test shapes still cross several query / key blocks
        default_m, default_n = 16, 16
    elif q.dtype == torch.float32:  # no tensor cores for ieee fp32: smaller tiles, less shared memory
        default_m, default_n = 32, (32 if block_d <= 128 else 16)
    else:
        default_m, default_n = 64, (64 if block_d <= 128 else 32)
    block_m = block_m or default_m
    block_n = block_n or default_n
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"{name}={b} must be a power of two >= 16")

    grid = (triton.cdiv(max_query_len, block_m), num_heads, num_requests)
    _paged_prefill_kernel[grid](
        q,
        key_cache,
        value_cache,
        out,
        block_tables,
        context_lens,
        query_start_loc,
        float(scale) * 1.4426950408889634,  # log2(e)
        *q.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        *out.stride(),
        *block_tables.stride(),
        block_size,
        head_dim,
        QUERIES_PER_KV=num_heads // num_kv_heads,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
        DOT_FP32=_INTERPRETED and q.dtype != torch.float32,
        num_warps=4,
        num_stages=2,
    )
    return out


def block_tables_from_slots(context_slots: list[torch.Tensor], block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's cache slots (slot = block_id * block_size + offset for positions 0..n-1)
    -> the padded (R, max_blocks) int32 block table (padding 0) and the (R,) int32 context lens."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    device = context_slots[0].device if context_slots else torch.device("cpu")
    blocks, lens = [], []
    for r, slots in enumerate(context_slots):
        slots = slots.reshape(-1).to(torch.int64)
        n = slots.numel()
        request_blocks = slots[::block_size] // block_size  # the block of positions 0, bs, 2bs, ...
        positions = torch.arange(n, device=slots.device)
        expected = request_blocks.repeat_interleave(block_size)[:n] * block_size + positions % block_size
        if not torch.equal(slots, expected):
            raise ValueError(f"request {r}: slots are not block_id * {block_size} + position % {block_size}")
        blocks.append(request_blocks)
        lens.append(n)
    max_blocks = max([b.numel() for b in blocks], default=0)
    table = torch.zeros((len(blocks), max(1, max_blocks)), dtype=torch.int32, device=device)
    for r, b in enumerate(blocks):
        table[r, : b.numel()] = b.to(device=device, dtype=torch.int32)
    return table, torch.tensor(lens, dtype=torch.int32, device=device)
