"""Causal self-attention of one prefill, three ways (llm.c ``dev/cuda`` style).

Every version has one signature:

    out = kernel(q, k, v, scale)
        q     (H, N, D)     post-RoPE queries of N tokens, H query heads
        k, v  (KVH, N, D)   keys and values; GQA: query head h reads KV head h // (H // KVH)
        out   (H, N, D)     query i attends keys 0..i: softmax(q k^T * scale + causal mask) v

Versions (each says what it changes from the one before):

    v1 naive    The oracle. Repeats K/V up to H heads, materializes the (H, N, N) score
                matrix, masks the future with -inf, softmax, multiplies by V. Obviously
                right, O(N^2) memory.
    v2 sdpa     torch.nn.functional.scaled_dot_product_attention(is_causal=True,
                enable_gqa=True): the library kernel the engine itself calls. It picks a
                fused backend (flash attention on CPU, FlashAttention / memory-efficient
                kernels on CUDA) and reads shared K/V heads without copying them.
    v3 blocked  The FlashAttention algorithm (Dao et al. 2022, Alg. 1) in plain torch:
                query blocks x key blocks, a running row max and row sum (online softmax,
                Milakov & Gimelshein 2018) rescale what was already summed, key blocks
                above the diagonal are skipped, and at most one (H, B, B) tile of scores
                exists at a time: the N x N matrix is never built. GQA by broadcasting.

``check_and_time`` runs a version against v1 first and raises ``KernelCheckError`` when
they differ by more than the tolerance; only then it warms the kernel up and times it
(median of several runs; CUDA events on a GPU, perf_counter on a CPU, the device
synchronized before the clock is read), and measures its memory in a separate call.

Memory, said honestly (two numbers, never mixed):

    measured   CUDA: torch.cuda.max_memory_allocated above what was allocated before the
               call. CPU: torch.profiler(profile_memory=True) allocation events, the peak
               of (bytes allocated - bytes freed) during the call. Both count tensors from
               torch's allocator, the output included, not a library's private scratch
               buffers (v2's backend may use some).
    analytic   the bytes of the largest intermediate tensor the version creates, from the
               shapes: v1 the (H, N, N) scores, v3 one fp32 (H, B, B) tile; v2 unknown
               (the library chooses its backend).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefillviz.backends.ops.paged_check import ORACLE_ROW_BLOCK, KernelCheckError, compare_to_oracle
from prefillviz.kernels.harness import KernelResult, time_checked

BLOCK_SIZE = 64  # v3's query and key block (tile) size
# 8 steps of the dtype (P and the output rounded; 16-bit scores rounded, |s| x half a step, averaging over the keys)
# + fp32 sums over up to 4,096 keys or dims (sqrt(4096) eps_fp32, twice)
"""Allowed max |kernel - oracle|, per unit of max |v| (the output is a weighted mean of V rows)."""


# ------------------------------------------------------------------------------ versions
def attention_naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, row_block: int | None = None
) -> torch.Tensor:
    """v1, the oracle: full score matrix, -inf above the diagonal, softmax, times V.

    ``row_block`` does the same arithmetic ``row_block`` query rows at a time, so that the
    check of a long prompt fits in memory (the timed v1 always builds the whole matrix).
    """
    num_heads, num_tokens, _ = q.shape
    groups = num_heads // k.shape[0]
    k = k.repeat_interleave(groups, dim=0)  # (H, N, D): head h gets KV head h // groups
    v = v.repeat_interleave(groups, dim=0)  # (H, N, D)
    block = row_block or num_tokens
    outputs = []
    for row in range(0, num_tokens, block):
        rows = min(block, num_tokens - row)
        scores = (q[:, row : row + rows] @ k.transpose(-1, -2)) * scale  # (H, rows, N)
        query_position = torch.arange(row, row + rows, device=q.device)[:, None]
        future = torch.arange(num_tokens, device=q.device)[None, :] > query_position  # key j > query i
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)  # rows sum to 1
        outputs.append(probs @ v)  # (H, rows, D)
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)


def attention_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """v2: torch's fused kernel, causal and GQA-aware."""
    out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=scale, enable_gqa=True)
    return out[0]  # (H, N, D)


def attention_blocked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, block_size: int = BLOCK_SIZE
) -> torch.Tensor:
    """v3: tiles of queries x keys with an online softmax; never more than one score tile.

    For each query block, walk the key blocks left of (and on) the diagonal:

        m' = max(m, rowmax(S))          S = q_blk k_blk^T * scale   (H, Bq, Bk)
        P  = exp(S - m')
        l' = l * exp(m - m') + rowsum(P)
        O' = O * exp(m - m') + P v_blk
        out = O / l                       after the last key block
    """
    num_heads, num_tokens, head_dim = q.shape
    num_kv_heads = k.shape[0]
    groups = num_heads // num_kv_heads
    q = q.reshape(num_kv_heads, groups, num_tokens, head_dim)  # (KVH, G, N, D): head h = (h // G, h % G)
    k = k[:, None]  # (KVH, 1, N, D): broadcast to the G query heads sharing it, no copy
    v = v[:, None]  # (KVH, 1, N, D)
    out = torch.empty_like(q)  # (KVH, G, N, D)
    for q_start in range(0, num_tokens, block_size):
        q_end = min(q_start + block_size, num_tokens)
        q_block = q[:, :, q_start:q_end].float() * scale  # (KVH, G, Bq, D), accumulate in fp32
        row_max = torch.full(q_block.shape[:-1], float("-inf"), device=q.device)  # (KVH, G, Bq)
        row_sum = torch.zeros(q_block.shape[:-1], device=q.device)  # (KVH, G, Bq)
        acc = torch.zeros_like(q_block)  # (KVH, G, Bq, D)
        for k_start in range(0, q_end, block_size):  # causal: blocks right of the diagonal skipped
            k_end = min(k_start + block_size, q_end)
            scores = q_block @ k[:, :, k_start:k_end].float().transpose(-1, -2)  # (KVH, G, Bq, Bk)
            if k_end > q_start + 1:  # the tile crosses the diagonal: mask keys after each query
                query_pos = torch.arange(q_start, q_end, device=q.device)[:, None]
                key_pos = torch.arange(k_start, k_end, device=q.device)[None, :]
                scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
            new_max = torch.maximum(row_max, scores.amax(dim=-1))  # finite: key 0 is seen first
            correction = torch.exp(row_max - new_max)  # rescales what was summed under the old max
            probs = torch.exp(scores - new_max[..., None])  # (KVH, G, Bq, Bk)
            row_sum = row_sum * correction + probs.sum(dim=-1)
            acc = acc * correction[..., None] + probs @ v[:, :, k_start:k_end].float()
            row_max = new_max
        out[:, :, q_start:q_end] = (acc / row_sum[..., None]).to(out.dtype)
    return out.reshape(num_heads, num_tokens, head_dim)  # (H, N, D)


# ------------------------------------------------------------------------------ registry
@dataclass(frozen=True)
class AttentionKernel:
    """One version: its name, what it changes, the function, and its biggest intermediate."""

    name: str
    version: int
    changes: str
    forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
    largest_intermediate: Callable[[int, int, int], int | None]  # (H, N, element size) -> bytes

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return self.forward(q, k, v, scale)


NAIVE = AttentionKernel(
    "v1 naive",
    1,
    "the oracle: (H, N, N) scores, mask, softmax, times V",
    attention_naive,
    lambda heads, n, element_size: heads * n * n * element_size,  # the score matrix (softmax makes a second)
)
SDPA = AttentionKernel(
    "v2 sdpa",
    2,
    "torch scaled_dot_product_attention(is_causal, enable_gqa): a fused library kernel",
    attention_sdpa,
    lambda heads, n, element_size: None,  # the backend decides
)
BLOCKED = AttentionKernel(
    "v3 blocked",
    3,
    f"flash-attention algorithm in torch: {BLOCK_SIZE}x{BLOCK_SIZE} tiles, online softmax, no N x N matrix",
    attention_blocked,
    lambda heads, n, element_size: heads * min(n, BLOCK_SIZE) ** 2 * 4,  # one fp32 score tile
)
KERNELS: tuple[AttentionKernel, ...] = (NAIVE, SDPA, BLOCKED)


def get_kernel(name: str) -> AttentionKernel:
    """The kernel called ``name`` (e.g. ``"v3 blocked"``)."""
    for kernel in KERNELS:
        if kernel.name == name:
            return kernel
    raise KeyError(f"No attention kernel named {name!r}; there are {', '.join(k.name for k in KERNELS)}.")


# ------------------------------------------------------------------------------ check
def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape:
        raise KernelCheckError(
            f"Need q (H, N, D) and k, v (KVH, N, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}."
        )
    if q.shape[1:] != k.shape[1:] or q.shape[0] % k.shape[0] or q.shape[1] < 1:
        raise KernelCheckError(
            f"q {tuple(q.shape)} and k/v {tuple(k.shape)} must share N >= 1 and D, and H must be a multiple of KVH."
        )


@torch.inference_mode()
def check_against_oracle(
    kernel: AttentionKernel,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    tolerance: float | None = None,
) -> tuple[float, float]:
    """Runs ``kernel`` and the fp32 naive oracle on the same inputs.

    Args:
        kernel: the version to check.
        q, k, v: (H, N, D), (KVH, N, D), (KVH, N, D) on one device, one dtype.
        scale: the softmax scale (usually D ** -0.5).
        tolerance: allowed max |difference| per unit of max |v|; None takes
            ``DEFAULT_TOLERANCE`` for the dtype.

    Returns:
        (max |kernel - oracle|, the allowed difference it was held to).

    Raises:
        KernelCheckError: wrong shapes, a wrong output shape, non-finite values, or a
            difference above the allowed one.
    """
    _check_shapes(q, k, v)
    expected = attention_naive(q.float(), k.float(), v.float(), scale, row_block=ORACLE_ROW_BLOCK)  # (H, N, D) fp32
    where = f"H={q.shape[0]}, KVH={k.shape[0]}, N={q.shape[1]}, D={q.shape[2]}"
    return compare_to_oracle(kernel.name, kernel(q, k, v, scale), expected, v, tolerance, where)


# ------------------------------------------------------------------------------ together
def check_and_time(
    kernel: AttentionKernel,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    runs: int = 5,
    warmup: int = 2,
    tolerance: float | None = None,
    measure_memory: bool = True,
) -> KernelResult:
    """Check ``kernel`` against v1, then time it, then measure its memory.

    Args:
        kernel: the version.
        q, k, v: (H, N, D), (KVH, N, D), (KVH, N, D) on one device.
        scale: softmax scale.
        runs: timed runs (median kept).
        warmup: untimed calls first.
        tolerance: see ``check_against_oracle``.
        measure_memory: also run once under the memory measurement.

    Raises:
        KernelCheckError: the kernel disagrees with the oracle; nothing is timed.
    """
    difference, allowed = check_against_oracle(kernel, q, k, v, scale, tolerance)
    return time_checked(
        kernel.name, kernel.version, lambda: kernel(q, k, v, scale), q, k.shape[0], (difference, allowed), runs, warmup,
        measure_memory,
        largest_intermediate_bytes=kernel.largest_intermediate(q.shape[0], q.shape[1], q.element_size()),
    )
