"""Attention maps recomputed from the post-RoPE queries and keys captured during a run.

The timing pass runs fast attention (SDPA) that never materializes the probabilities, so
the maps are rebuilt afterwards from the captured q/k of each layer, exactly as eager
attention computes them (DESIGN.md, "Facts about the tools"):

    P_h = softmax(q_h k_{h // groups}^T * scaling + causal mask)    groups = H // KVH

          keys j ->
    query  1 . . . .        row i may attend keys j <= i; the rest is masked (p = 0)
      i    1 1 . . .
      |    1 1 1 . .
      v    1 1 1 1 .

Inputs are one request and one layer: ``q`` (H, N, D) and ``k`` (KVH, N, D) over all N
prompt positions (row i is position i), as torch tensors or numpy arrays in any float
dtype; everything is computed in fp32. Long prompts are handled in blocks of query rows,
so memory stays bounded (one block of rows x N keys) even for N = 4096.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class HeadSummary:
    """One number per head of one layer, each averaged over the query rows.

    Attributes:
        entropy: (H,) mean row entropy in nats; row i of a uniform head gives log(i + 1).
        sink: (H,) mean probability on key 0 over rows 1..N-1 (row 0 can only attend key 0,
            so it would add a trivial 1); for N = 1 it is that single row's 1.0.
        mean_lookback: (H,) mean over rows i of sum_j p_ij (i - j): how many positions back
            the head looks on average (row 0 contributes 0).
    """

    entropy: np.ndarray
    sink: np.ndarray
    mean_lookback: np.ndarray


@dataclass(frozen=True)
class ChunkStrip:
    """The part of the causal matrix one chunk of a chunked prefill computed.

    Query rows [query_start, query_end) attended keys [key_start, key_end): the cached
    context plus the chunk itself, so key_start is 0 and key_end is query_end.
    """

    chunk_index: int
    query_start: int
    query_end: int
    key_start: int
    key_end: int


def _as_fp32(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    return x.detach().float()


def _check_shapes(q: torch.Tensor, k: torch.Tensor) -> int:
    """Validate (H, N, D) / (KVH, N, D) and return the GQA group size H // KVH."""
    if q.ndim != 3 or k.ndim != 3:
        raise ValueError(f"expected q (H, N, D) and k (KVH, N, D), got {tuple(q.shape)} and {tuple(k.shape)}")
    num_heads, num_kv_heads = q.shape[0], k.shape[0]
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise ValueError(f"{num_heads} query heads cannot share {num_kv_heads} KV heads evenly")
    if q.shape[1] == 0:
        raise ValueError("no prompt positions (N = 0)")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"head_dim differs: q has {q.shape[2]}, k has {k.shape[2]}")
    if k.shape[1] < q.shape[1]:
        raise ValueError(f"k has {k.shape[1]} positions, fewer than q's {q.shape[1]}")
    return num_heads // num_kv_heads


def _causal_softmax(scores: torch.Tensor, query_start: int) -> torch.Tensor:
    """Softmax over keys of (..., rows, keys) scores whose row r is position query_start + r (masks in place)."""
    rows, num_keys = scores.shape[-2], scores.shape[-1]
    positions = torch.arange(query_start, query_start + rows, device=scores.device)[:, None]
    masked = torch.arange(num_keys, device=scores.device)[None, :] > positions  # (rows, keys)
    return torch.softmax(scores.masked_fill_(masked, float("-inf")), dim=-1)


def attention_probs(
    q: torch.Tensor | np.ndarray,
    k: torch.Tensor | np.ndarray,
    head: int,
    scaling: float,
    query_start: int = 0,
    query_end: int | None = None,
) -> torch.Tensor:
    """Attention probabilities of one head for query rows [query_start, query_end).

    Chunked steps: the mask is offset by the cached context. A chunked step over positions
    [query_start, query_end) had query_start tokens cached; its queries saw those plus the
    chunk's own keys, causally. That is exactly this slice of the full map, so one function
    serves parallel, chunked and token-by-token prefill.

    Args:
        q: (H, N, D) post-RoPE queries of one layer.
        k: (KVH, N, D) post-RoPE keys of the same layer.
        head: query head; it reads KV head ``head // (H // KVH)`` (GQA).
        scaling: the layer's softmax scale (``module.scaling``, usually D ** -0.5).
        query_start: first query position (the cached context length of a chunk).
        query_end: one past the last query position; defaults to N.

    Returns:
        (query_end - query_start, query_end) fp32 probabilities; row r is position
        query_start + r over keys 0..query_end-1, zero above the diagonal.
    """
    q, k = _as_fp32(q), _as_fp32(k)
    groups = _check_shapes(q, k)
    if not 0 <= head < q.shape[0]:
        raise ValueError(f"head {head} out of range for {q.shape[0]} heads")
    query_end = q.shape[1] if query_end is None else query_end
    if not 0 <= query_start < query_end <= q.shape[1]:
        raise ValueError(f"query range [{query_start}, {query_end}) not inside 0..{q.shape[1]}")
    queries = q[head, query_start:query_end]  # (rows, D)
    keys = k[head // groups, :query_end]  # (query_end, D)
    return _causal_softmax(queries @ keys.T * scaling, query_start)  # (rows, query_end)


def head_summaries(
    q: torch.Tensor | np.ndarray,
    k: torch.Tensor | np.ndarray,
    scaling: float,
    block_rows: int = 256,
) -> HeadSummary:
    """Entropy, sink score and mean look-back of every head of one layer.

    Rows are processed ``block_rows`` at a time for all heads together, so the largest
    tensor is (H, block_rows, N), never (H, N, N).

    Args:
        q: (H, N, D) post-RoPE queries of one layer.
        k: (KVH, N, D) post-RoPE keys of the same layer.
        scaling: the layer's softmax scale.
        block_rows: query rows per block.

    Returns:
        A ``HeadSummary`` of (H,) float32 arrays.
    """
    q, k = _as_fp32(q), _as_fp32(k)
    groups = _check_shapes(q, k)
    num_heads, num_tokens = q.shape[0], q.shape[1]
    keys = k[:, :num_tokens].repeat_interleave(groups, dim=0)  # (H, N, D)
    entropy_sum = torch.zeros(num_heads)
    sink_sum = torch.zeros(num_heads)
    lookback_sum = torch.zeros(num_heads)
    for start in range(0, num_tokens, block_rows):
        end = min(start + block_rows, num_tokens)
        scores = q[:, start:end] @ keys[:, :end].transpose(1, 2) * scaling  # (H, rows, end)
        probs = _causal_softmax(scores, start)
        del scores
        entropy_sum += -torch.special.xlogy(probs, probs).sum(dim=(1, 2)).cpu()
        first_row = 1 if start == 0 and num_tokens > 1 else 0  # row 0 trivially sinks 1.0
        sink_sum += probs[:, first_row:, 0].sum(dim=1).cpu()
        # sum_j p_ij (i - j) = i - sum_j p_ij j, since each row sums to 1
        key_positions = torch.arange(end, dtype=probs.dtype, device=probs.device)  # (end,)
        row_positions = torch.arange(start, end, dtype=probs.dtype, device=probs.device)  # (rows,)
        lookback_sum += (row_positions - probs @ key_positions).sum(dim=1).cpu()
    sink_rows = max(num_tokens - 1, 1)
    return HeadSummary(
        entropy=(entropy_sum / num_tokens).numpy(),
        sink=(sink_sum / sink_rows).numpy(),
        mean_lookback=(lookback_sum / num_tokens).numpy(),
    )


def all_head_summaries(
    qs: list[torch.Tensor | np.ndarray],
    ks: list[torch.Tensor | np.ndarray],
    scalings: list[float] | float,
    block_rows: int = 256,
) -> dict[str, np.ndarray]:
    """``head_summaries`` for every layer, stacked into (layers, heads) arrays.

    Args:
        qs: per layer, (H, N, D) post-RoPE queries.
        ks: per layer, (KVH, N, D) post-RoPE keys.
        scalings: per layer softmax scale, or one value for all layers.
        block_rows: query rows per block.

    Returns:
        ``{"entropy", "sink", "mean_lookback"}`` -> (layers, heads) float32 arrays.
    """
    if len(qs) != len(ks):
        raise ValueError(f"{len(qs)} layers of queries but {len(ks)} layers of keys")
    if not isinstance(scalings, (list, tuple)):
        scalings = [float(scalings)] * len(qs)
    if len(scalings) != len(qs):
        raise ValueError(f"{len(scalings)} scalings for {len(qs)} layers")
    layers = [head_summaries(q, k, s, block_rows) for q, k, s in zip(qs, ks, scalings)]
    return {
        name: np.stack([getattr(summary, name) for summary in layers])
        for name in ("entropy", "sink", "mean_lookback")
    }


def pooled_attention_map(
    q: torch.Tensor | np.ndarray,
    k: torch.Tensor | np.ndarray,
    head: int,
    scaling: float,
    max_size: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
    """A max-pooled attention map of one head, at most ``max_size`` x ``max_size``.

    Rows and keys are cut into bins of ``ceil(N / max_size)`` positions (the last bin may
    be shorter); each cell is the largest probability in its (row bin, key bin) block, so
    a sharp attention peak stays visible after pooling. For N <= max_size the bins are
    single positions and the map is exact. Cells fully above the diagonal are 0.

    Args:
        q: (H, N, D) post-RoPE queries of one layer.
        k: (KVH, N, D) post-RoPE keys of the same layer.
        head: query head.
        scaling: the layer's softmax scale.
        max_size: the most bins per axis.

    Returns:
        ``(pooled, bin_edges)``: pooled (m, m) float32; bin_edges (m + 1,) int64 positions,
        bin b covering [bin_edges[b], bin_edges[b + 1]) on both axes.
    """
    q, k = _as_fp32(q), _as_fp32(k)
    num_tokens = q.shape[1]
    if max_size < 1:
        raise ValueError(f"max_size must be >= 1, got {max_size}")
    bin_size = math.ceil(num_tokens / max_size)
    num_bins = math.ceil(num_tokens / bin_size)
    padded = num_bins * bin_size
    bins_per_block = max(1, 256 // bin_size)  # about 256 query rows per block
    pooled = torch.zeros(num_bins, num_bins)
    for first_bin in range(0, num_bins, bins_per_block):
        last_bin = min(first_bin + bins_per_block, num_bins)
        start, end = first_bin * bin_size, min(last_bin * bin_size, num_tokens)
        probs = attention_probs(q, k, head, scaling, start, end)  # (rows, end)
        rows = (last_bin - first_bin) * bin_size
        block = torch.zeros(rows, padded, device=probs.device)  # p >= 0, so zero padding keeps the max
        block[: end - start, :end] = probs
        cells = block.view(last_bin - first_bin, bin_size, num_bins, bin_size).amax(dim=(1, 3))
        pooled[first_bin:last_bin] = cells.cpu()
    bin_edges = np.minimum(np.arange(num_bins + 1, dtype=np.int64) * bin_size, num_tokens)
    return pooled.numpy(), bin_edges


def causal_chunk_strips(chunk_boundaries: list[int], num_tokens: int) -> list[ChunkStrip]:
    """The (query rows, key columns) rectangle each chunk of a chunked prefill computed.

    Chunk c covers positions [b_c, b_{c+1}); it attends every earlier position (from the
    cache) and itself causally, so its strip is rows [b_c, b_{c+1}) x keys [0, b_{c+1}):

        keys ->       chunk 0: rows 0..6,   keys 0..6
        A . . .       chunk 1: rows 7..13,  keys 0..13
        B B . .       chunk 2: rows 14..19, keys 0..19
        C C C .

    Args:
        chunk_boundaries: increasing chunk start positions; the final end may be included.
            The first need not be 0: after a prefix-cache hit the first chunk starts at the
            number of cached tokens, and rows before it were never computed in this run.
        num_tokens: prompt length; closes the last chunk.

    Returns:
        One ``ChunkStrip`` per chunk, in order.
    """
    edges = list(chunk_boundaries)
    if not edges or edges[-1] != num_tokens:
        edges.append(num_tokens)
    if any(a >= b for a, b in zip(edges, edges[1:])) or edges[0] < 0 or edges[-1] > num_tokens:
        raise ValueError(f"chunk boundaries {list(chunk_boundaries)} must increase within 0..{num_tokens}")
    return [
        ChunkStrip(chunk_index=c, query_start=a, query_end=b, key_start=0, key_end=b)
        for c, (a, b) in enumerate(zip(edges, edges[1:]))
    ]
