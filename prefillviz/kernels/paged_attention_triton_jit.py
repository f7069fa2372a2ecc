"""The Triton kernel of ``paged_attention_triton.py`` itself (imported from there only when triton
imports): one program per (query block, query head, request), walking the request's block table
with an online softmax. ``paged_attention_triton.py`` describes the algorithm and launches it."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _paged_prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    context_lens_ptr,
    query_start_loc_ptr,
    qk_scale,  # scale * log2(e): the softmax is taken with exp2
    stride_qh,
    stride_qt,
    stride_qd,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_oh,
    stride_ot,
    stride_od,
    stride_btr,
    stride_btb,
    block_size,
    head_dim,
    QUERIES_PER_KV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 (no TF32); None (backend default) for 16-bit
    DOT_FP32: tl.constexpr,  # interpreter only: upcast 16-bit tiles before tl.dot
):
    m_block = tl.program_id(0)
    head = tl.program_id(1)
    req = tl.program_id(2)

    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if m_block * BLOCK_M >= q_len:
        return
    ctx_len = tl.load(context_lens_ptr + req)
    prefix = ctx_len - q_len  # tokens cached before this step
    kv_head = head // QUERIES_PER_KV

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)  # query index within the request
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < q_len
    d_ok = offs_d < head_dim
    q_pos = prefix + offs_m  # each query's position in its request's sequence

    q_rows = (q_start + offs_m).to(tl.int64)
    q_ptrs = (
        q_ptr
        + head.to(tl.int64) * stride_qh
        + q_rows[:, None] * stride_qt
        + offs_d[None, :].to(tl.int64) * stride_qd
    )
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: no inf - inf = NaN
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # keys 0 .. (this block's last query position) are all this block can see
    kv_end = tl.minimum(prefix + (m_block + 1) * BLOCK_M, ctx_len)
    bt_row = block_tables_ptr + req.to(tl.int64) * stride_btr
    kv_head_off_k = kv_head.to(tl.int64) * stride_kh
    kv_head_off_v = kv_head.to(tl.int64) * stride_vh
    offs_d_k = offs_d.to(tl.int64) * stride_kd
    offs_d_v = offs_d.to(tl.int64) * stride_vd
    for start_n in range(0, kv_end, BLOCK_N):
        k_pos = start_n + offs_n  # (BLOCK_N,) key positions
        k_ok = k_pos < kv_end
        block_id = tl.load(bt_row + (k_pos // block_size) * stride_btb, mask=k_ok, other=0)
        block_id = block_id.to(tl.int64)
        in_block = (k_pos % block_size).to(tl.int64)

        k_off = block_id * stride_kb + in_block * stride_ks + kv_head_off_k  # (BLOCK_N,)
        k = tl.load(  # (BLOCK_D, BLOCK_N): K^T
            k_cache_ptr + k_off[None, :] + offs_d_k[:, None],
            mask=k_ok[None, :] & d_ok[:, None],
            other=0.0,
        )
        if DOT_FP32:
            qk = tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
        else:
            qk = tl.dot(q, k, input_precision=DOT_PRECISION)  # fp32 (BLOCK_M, BLOCK_N)
        qk = qk * qk_scale
        visible = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :]
        qk = tl.where(visible, qk, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old max
        p = tl.exp2(qk - m_new[:, None])  # masked: exp2(-inf) = 0
        l_i = l_i * alpha + tl.sum(p, 1)

        v_off = block_id * stride_vb + in_block * stride_vs + kv_head_off_v
        v = tl.load(  # (BLOCK_N, BLOCK_D); masked rows 0 so 0 * garbage never makes NaN
            v_cache_ptr + v_off[:, None] + offs_d_v[None, :],
            mask=k_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        p_v = p.to(v.dtype)  # tl.dot needs both operands in one dtype
        acc = acc * alpha[:, None]
        if DOT_FP32:
            acc = tl.dot(p_v.to(tl.float32), v.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(p_v, v, acc, input_precision=DOT_PRECISION)
        m_i = m_new

    l_i = tl.where(l_i > 0.0, l_i, 1.0)  # rows past q_len (never stored) stay finite
    out = acc / l_i[:, None]
    out_ptrs = (
        out_ptr
        + head.to(tl.int64) * stride_oh
        + q_rows[:, None] * stride_ot
        + offs_d[None, :].to(tl.int64) * stride_od
    )
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])

_INTERPRETED = type(_paged_prefill_kernel).__name__ == "InterpretedFunction"


@triton.jit
def _loop_to_loaded_bound(n_ptr, out_ptr):
    """The kernel's loop over key blocks in miniature: ``range`` to a bound loaded from memory. Triton
    3.6's interpreter takes that bound with ``int()`` of a one-element numpy array, which numpy 2.4 and
    later refuse; ``available`` runs this under the interpreter to say so before the kernel fails."""
    n = tl.load(n_ptr)
    count = n * 0
    for _ in range(0, n, 1):
        count += 1
    tl.store(out_ptr, count)
