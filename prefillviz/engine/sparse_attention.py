"""Block-sparse prefill: compute only the key blocks that matter, chosen by XAttention's antidiagonal scoring.

XAttention (Xu, Xiao, Huang, Guo, Han 2025, "XAttention: Block Sparse Attention with Antidiagonal
Scoring", arXiv 2503.16428) cuts a causal prompt's (N, N) attention matrix into square tiles of
``block_size`` tokens and computes only some of them:

    key block ->   0   1   2   3   4
    query block 0  D                        S  the sink: the first block, always computed
                1  S   D                    D  the diagonal: a block's own keys, always computed
                2  S   .   D                x  kept: scored among the highest of its row
                3  S   x   .   D            .  skipped: never multiplied
                4  S   .   x   .   D

1. **Score** (``antidiagonal_block_scores``): sum the antidiagonal of every ``stride`` x ``stride``
   square of q k^T (it crosses each row and column once, so no vertical or slash pattern hides), in
   one matmul of strided q and k at 1/stride of q k^T's cost; softmax, summed per tile.
2. **Select** (``select_blocks``): per head and query block, the ``keep_fraction`` of its causal key
   blocks that scored highest, the sink and the diagonal always (the paper keeps blocks up to a
   score threshold tau instead). ``keep_fraction = 1.0`` keeps every tile.
3. **Attend** (``block_sparse_attention``): per query block, one SDPA over its kept key blocks.

``block_sparse_backend(keep)`` runs it for each fresh long prompt; chunks and decodes stay dense (``paged_sdpa``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from prefillviz.engine.backend import TorchBackend
from prefillviz.engine.errors import ConfigError
from prefillviz.engine.paged_attention import PagedStep, paged_sdpa

SPARSE_BLOCK_SIZE = 128  # tokens per tile side (the paper's block size)
ANTIDIAGONAL_STRIDE = 16  # the scoring's square side: it costs 1/stride of q k^T (the paper uses 8 and 16)


def num_blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def blocks_to_keep(num_query_blocks: int, keep_fraction: float) -> torch.Tensor:
    """(nb,) how many key blocks query block i keeps: ceil(keep x (i + 1)), at least the sink and the diagonal."""
    causal = torch.arange(1, num_query_blocks + 1)
    wanted = torch.ceil(causal.double() * keep_fraction - 1e-9).long()  # 10 x 0.3 is 3, not 3.0000000000000004
    return wanted.clamp(min=2).minimum(causal)


def antidiagonal_block_scores(q: torch.Tensor, k: torch.Tensor, scale: float, block_size: int = SPARSE_BLOCK_SIZE,
                              stride: int = ANTIDIAGONAL_STRIDE) -> torch.Tensor:
    """XAttention's estimate of each tile's share of its query block's attention: q (H, N, D) and k (KVH, N, D),
    a fresh prompt's post-RoPE queries and keys -> (H, nb, nb) fp32, each row summing to 1 over its causal blocks."""
    if block_size % stride:
        raise ValueError(f"block_size {block_size} must be a multiple of stride {stride}.")
    num_heads, n, head_dim = q.shape
    nb = num_blocks(n, block_size)
    pad = nb * block_size - n
    q, k = (F.pad(q, (0, 0, 0, pad)), F.pad(k, (0, 0, 0, pad))) if pad else (q, k)  # zero rows past the prompt
    kv_heads, rows = k.shape[0], nb * block_size // stride
    # row a of q_strided holds queries a S + 0, ..., a S + S-1; row b of k_strided keys b S + S-1, ..., b S + 0:
    # their dot product is the antidiagonal's sum. A KV head's G query heads are G x rows rows (GQA, no copy of k)
    q_strided = q.reshape(kv_heads, -1, stride * head_dim)
    k_strided = k.reshape(kv_heads, rows, stride, head_dim).flip(2).mul_(scale / stride).reshape(kv_heads, rows, -1)
    scores = (q_strided @ k_strided.transpose(-1, -2)).view(num_heads, rows, rows)
    future = torch.ones(rows, rows, dtype=torch.bool, device=q.device).triu(1)
    future[:, rows - pad // stride :] = True  # padded keys are never attended
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1, dtype=torch.float32)
    probs[:, -(-n // stride) :] = 0  # rows of padded queries only
    per_block = block_size // stride
    probs = probs.view(num_heads, nb, per_block, rows).sum(2).view(num_heads, nb, nb, per_block).sum(-1)  # (H, nb, nb)
    return probs / probs.sum(-1, keepdim=True)


def select_blocks(scores: torch.Tensor, keep_fraction: float) -> torch.Tensor:
    """(H, nb, nb) bool: per head and query block, the highest-scoring ``keep_fraction`` of its causal key
    blocks, the sink (block 0) and the diagonal always among them; nothing above the diagonal."""
    if not 0.0 < keep_fraction <= 1.0:
        raise ValueError(f"keep_fraction must be in (0, 1], got {keep_fraction!r}.")
    nb = scores.shape[-1]
    index = torch.arange(nb, device=scores.device)
    ranked = scores.masked_fill(index[None, :] > index[:, None], float("-inf"))  # the future ranks last
    ranked = ranked.masked_fill((index[None, :] == 0) | (index[None, :] == index[:, None]), float("inf"))
    rank = ranked.argsort(dim=-1, descending=True, stable=True).argsort(dim=-1)  # each block's place in its row
    return rank < blocks_to_keep(nb, keep_fraction).to(scores.device)[None, :, None]


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, kept: torch.Tensor,
                           block_size: int = SPARSE_BLOCK_SIZE) -> torch.Tensor:
    """Causal attention over the kept tiles only: q (H, N, D), k and v (KVH, N, D), kept (H, nb, nb) -> (H, N, D).

    Every head of a query block keeps as many key blocks, so one SDPA call takes them all, gathered per head
    (H, kept x B, D) into buffers made once; the diagonal block is the last one kept, so one mask serves all heads.
    """
    num_heads, n, head_dim = q.shape
    nb = num_blocks(n, block_size)
    pad = nb * block_size - n
    kv_head = torch.arange(num_heads, device=q.device) // (num_heads // k.shape[0])  # (H,) each head's KV head
    k_blocks = F.pad(k, (0, 0, 0, pad)).reshape(-1, block_size, head_dim)  # (KVH nb, B, D): head g, block j at g nb + j
    v_blocks = F.pad(v, (0, 0, 0, pad)).reshape(-1, block_size, head_dim)
    keys_buffer = q.new_empty(num_heads * nb, block_size, head_dim)
    values_buffer = q.new_empty(num_heads * nb, block_size, head_dim)
    # mask[:, -kept B:]: 0 for the blocks before the diagonal, causal (-inf above it) in the last B columns
    mask = q.new_zeros(block_size, nb * block_size)
    future = torch.ones(block_size, block_size, dtype=torch.bool, device=q.device).triu(1)
    mask[:, -block_size:].masked_fill_(future, -torch.inf)
    out = torch.empty_like(q)
    for i in range(nb):
        rows = slice(i * block_size, min((i + 1) * block_size, n))
        chosen = kept[:, i, : i + 1].nonzero()[:, 1].view(num_heads, -1)  # (H, kept): key blocks, ascending
        num_kept = chosen.shape[1]
        index = (kv_head[:, None] * nb + chosen).flatten()  # (H kept,) rows of k_blocks
        keys = torch.index_select(k_blocks, 0, index, out=keys_buffer[: len(index)]).view(num_heads, -1, head_dim)
        values = torch.index_select(v_blocks, 0, index, out=values_buffer[: len(index)]).view(num_heads, -1, head_dim)
        block_mask = mask[: rows.stop - rows.start, -num_kept * block_size :]  # (rows, kept B)
        out[:, rows] = F.scaled_dot_product_attention(q[None, :, rows], keys[None], values[None], attn_mask=block_mask,
                                                      scale=scale)[0]
    return out


def sparse_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, keep_fraction: float,
                   block_size: int = SPARSE_BLOCK_SIZE, stride: int = ANTIDIAGONAL_STRIDE) -> torch.Tensor:
    """Score, select, attend: a fresh prompt's attention (H, N, D) over its kept tiles."""
    kept = select_blocks(antidiagonal_block_scores(q, k, scale, block_size, stride), keep_fraction)
    return block_sparse_attention(q, k, v, scale, kept, block_size)


def paged_sparse_prefill(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float, keep_fraction: float,
                         dense: Callable, block_size: int = SPARSE_BLOCK_SIZE,
                         stride: int = ANTIDIAGONAL_STRIDE) -> torch.Tensor:
    """``paged_attention``'s signature: each of ``sparse_requests`` runs ``sparse_prefill``; every other request
    (a chunk after cached context, a decode) runs ``dense``."""
    fresh_and_long = sparse_requests(step, block_size)
    if not any(fresh_and_long):
        return dense(q, k_new, v_new, key_cache, value_cache, step, scale)
    outputs = []
    for r in range(step.num_requests):
        start, end = step.query_start_loc[r], step.query_start_loc[r + 1]
        q_r, k_r, v_r = q[:, start:end], k_new[:, start:end], v_new[:, start:end]
        if fresh_and_long[r]:
            outputs.append(sparse_prefill(q_r, k_r, v_r, scale, keep_fraction, block_size, stride))
        else:  # request r alone, as a step of its own
            alone = PagedStep([0, end - start], [step.num_computed[r]], step.slot_mapping[start:end],
                              [step.context_slots[r]])
            outputs.append(dense(q_r, k_r, v_r, key_cache, value_cache, alone, scale))
    return torch.cat(outputs, dim=1)


def sparse_requests(step: PagedStep, block_size: int = SPARSE_BLOCK_SIZE) -> list[bool]:
    """Per request: whether it prefills a whole fresh prompt of at least two blocks (the ones made block-sparse)."""
    return [n == 0 and step.query_len(r) >= 2 * block_size for r, n in enumerate(step.num_computed)]


def block_sparse_backend(keep_fraction: float) -> TorchBackend:
    """The textbook backend, with a fresh prompt's prefill block-sparse at ``keep_fraction`` (0 < f <= 1)."""
    if isinstance(keep_fraction, bool) or not isinstance(keep_fraction, float | int) or not 0 < keep_fraction <= 1:
        raise ConfigError(f"The block-sparse keep fraction must be in (0, 1], got {keep_fraction!r}.")
    kernel = partial(paged_sparse_prefill, keep_fraction=keep_fraction, dense=paged_sdpa)
    return TorchBackend(kernel, f"block-sparse prefill (XAttention, keep {keep_fraction:g}), else torch SDPA")
