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

1. **Score** (``antidiagonal_block_scores``). Within every ``stride`` x ``stride`` square of the
   matrix, sum the antidiagonal (lower left to upper right) of q k^T: it crosses every row and
   every column of the square once, so a vertical or a slash pattern cannot hide from it. The paper
   computes it as one matmul of strided, reordered q and k (each row of the result is ``stride``
   query rows read backwards against ``stride`` key rows read forwards), softmaxes each row under
   a causal mask at stride resolution and sums the result over each tile: a tile's share of its
   query block's attention, estimated at 1/stride of the cost of q k^T.
2. **Select** (``select_blocks``). Per head and per query block, keep the ``keep_fraction`` of its
   causal key blocks that scored highest, always with the sink and the diagonal. (The paper keeps
   blocks until their scores add up to a threshold tau; ``BlockSelection.score_mass_kept`` is the
   tau a selection reached, so the two meet.) ``keep_fraction = 1.0`` keeps every causal tile.
3. **Attend** (``block_sparse_attention``). Each query block runs one SDPA over its kept key blocks,
   every head at once, with the causal mask inside the diagonal block.

The engine runs it for a fresh prompt's prefill only (``paged_sparse_prefill``); chunks after cached
context, decodes and the last layer's kept rows stay dense, with the backend's own kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefillviz.engine.paged_attention import PagedStep

SPARSE_BLOCK_SIZE = 128  # tokens per tile side (the paper's block size)
ANTIDIAGONAL_STRIDE = 16  # the scoring's square side: it costs 1/stride of q k^T (the paper uses 8 and 16)


@dataclass
class BlockSelection:
    """Which tiles each head computes, and the scores that chose them.

    Attributes:
        kept: (H, nb, nb) bool: query block i of head h computes key block j.
        scores: (H, nb, nb) fp32: the antidiagonal estimate of each tile's share of its query block's
            attention (each row sums to 1 over its causal blocks).
        num_tokens: the prompt's length N.
        block_size: tokens per tile side.
    """

    kept: torch.Tensor
    scores: torch.Tensor
    num_tokens: int
    block_size: int

    def tiles_kept_fraction(self) -> float:
        """Kept tiles over the causal tiles (those on or below the diagonal), over every head."""
        nb = self.kept.shape[-1]
        return float(self.kept.sum()) / (self.kept.shape[0] * nb * (nb + 1) / 2)

    def pairs_kept_fraction(self) -> float:
        """Computed (query, key) pairs over the causal pairs dense attention computes: its FLOPs kept."""
        pairs = tile_pairs(self.num_tokens, self.block_size)  # (nb, nb)
        return float((self.kept.float() * pairs).sum()) / (self.kept.shape[0] * float(pairs.sum()))

    def score_mass_kept(self) -> float:
        """The estimated attention mass the kept tiles hold, averaged over heads and query blocks (XAttention's tau)."""
        return float((self.scores * self.kept).sum(-1).mean())


def num_blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def tile_pairs(num_tokens: int, block_size: int) -> torch.Tensor:
    """(nb, nb) fp32: the causal (query, key) pairs in each tile (the last block may be short)."""
    nb = num_blocks(num_tokens, block_size)
    sizes = torch.full((nb,), float(block_size))
    sizes[-1] = num_tokens - (nb - 1) * block_size
    pairs = torch.tril(sizes[:, None] * sizes[None, :], diagonal=-1)
    return pairs + torch.diag(sizes * (sizes + 1) / 2)


def blocks_to_keep(num_query_blocks: int, keep_fraction: float) -> torch.Tensor:
    """(nb,) how many key blocks query block i keeps: ceil(keep x (i + 1)), at least the sink and the diagonal."""
    causal = torch.arange(1, num_query_blocks + 1)
    wanted = torch.ceil(causal.double() * keep_fraction - 1e-9).long()  # 10 x 0.3 is 3, not 3.0000000000000004
    return wanted.clamp(min=2).minimum(causal)


def antidiagonal_block_scores(q: torch.Tensor, k: torch.Tensor, scale: float, block_size: int = SPARSE_BLOCK_SIZE,
                              stride: int = ANTIDIAGONAL_STRIDE) -> torch.Tensor:
    """XAttention's estimate of each tile's share of its query block's attention.

    Args:
        q: (H, N, D) post-RoPE queries of a fresh prompt.
        k: (KVH, N, D) its keys (query head h reads KV head h // (H / KVH)).
        scale: the attention's scale (1 / sqrt(D)).
        block_size: tokens per tile side (a multiple of ``stride``).
        stride: the side of the squares whose antidiagonals are summed.

    Returns:
        (H, nb, nb) fp32, each row summing to 1 over its causal blocks (0 above the diagonal).
    """
    if block_size % stride:
        raise ValueError(f"block_size {block_size} must be a multiple of stride {stride}.")
    num_heads, n, head_dim = q.shape
    nb = num_blocks(n, block_size)
    pad = nb * block_size - n
    q, k = F.pad(q, (0, 0, 0, pad)), F.pad(k, (0, 0, 0, pad))  # zero rows past the prompt
    k = k.repeat_interleave(num_heads // k.shape[0], dim=0)  # (H, nb B, D)
    # row a of q_strided holds queries a S + S-1, ..., a S + 0; row b of k_strided keys b S + 0, ..., b S + S-1
    q_strided = torch.cat([q[:, stride - 1 - i :: stride] for i in range(stride)], dim=-1)  # (H, nb B / S, S D)
    k_strided = torch.cat([k[:, i::stride] for i in range(stride)], dim=-1)
    scores = (q_strided @ k_strided.transpose(-1, -2)).float() * (scale / stride)  # (H, nb B/S, nb B/S)
    rows = scores.shape[-1]
    future = torch.ones(rows, rows, dtype=torch.bool, device=q.device).triu(1)
    future[:, rows - pad // stride :] = True  # padded keys are never attended
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    probs[:, -(-n // stride) :] = 0  # rows of padded queries only
    per_block = block_size // stride
    probs = probs.view(num_heads, nb, per_block, nb, per_block).sum(dim=(2, 4))  # (H, nb, nb)
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

    Every head of a query block keeps as many key blocks (``select_blocks``), so one SDPA call takes
    them all: the kept blocks' keys are gathered per head, (H, kept x B, D). The diagonal block is
    the last one kept, so one mask serves every head: nothing masked before it, causal inside it.
    The gathered keys, values and masks are views of buffers made once (fresh large tensors cost page
    faults on a CPU, more than the copies themselves).
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
                   block_size: int = SPARSE_BLOCK_SIZE, stride: int = ANTIDIAGONAL_STRIDE,
                   ) -> tuple[torch.Tensor, BlockSelection]:
    """Score, select, attend: a fresh prompt's attention over its kept tiles. Returns ((H, N, D), the selection)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # the engine's are (T, heads, D) transposed views
    scores = antidiagonal_block_scores(q, k, scale, block_size, stride)
    selection = BlockSelection(select_blocks(scores, keep_fraction), scores, q.shape[1], block_size)
    return block_sparse_attention(q, k, v, scale, selection.kept, block_size), selection


def one_request(step: PagedStep, r: int) -> PagedStep:
    """Request r of a step as a step of its own (rows from 0)."""
    start, end = step.query_start_loc[r], step.query_start_loc[r + 1]
    return PagedStep([0, end - start], [step.num_computed[r]], step.slot_mapping[start:end], [step.context_slots[r]])


def paged_sparse_prefill(q, k_new, v_new, key_cache, value_cache, step: PagedStep, scale: float, keep_fraction: float,
                         dense: Callable, block_size: int = SPARSE_BLOCK_SIZE,
                         stride: int = ANTIDIAGONAL_STRIDE) -> torch.Tensor:
    """``paged_attention``'s signature: each request that prefills a whole fresh prompt of at least two
    blocks runs ``sparse_prefill``; every other (a chunk after cached context, a decode) runs ``dense``."""
    def fresh_and_long(r: int) -> bool:
        return step.num_computed[r] == 0 and step.query_len(r) >= 2 * block_size

    if not any(fresh_and_long(r) for r in range(step.num_requests)):
        return dense(q, k_new, v_new, key_cache, value_cache, step, scale)
    outputs = []
    for r in range(step.num_requests):
        rows = slice(step.query_start_loc[r], step.query_start_loc[r + 1])
        q_r, k_r, v_r = q[:, rows], k_new[:, rows], v_new[:, rows]
        if fresh_and_long(r):
            outputs.append(sparse_prefill(q_r, k_r, v_r, scale, keep_fraction, block_size, stride)[0])
        else:
            outputs.append(dense(q_r, k_r, v_r, key_cache, value_cache, one_request(step, r), scale))
    return torch.cat(outputs, dim=1)


def attention_flops_kept_fraction(num_tokens: int, keep_fraction: float, block_size: int = SPARSE_BLOCK_SIZE) -> float:
    """The share of a fresh prompt's causal attention pairs ``select_blocks`` computes. It does not depend on
    which blocks win: every kept block but the diagonal is a full one, off the diagonal."""
    nb = num_blocks(num_tokens, block_size)
    pairs = tile_pairs(num_tokens, block_size)
    diagonal = pairs.diagonal()
    rows = torch.full((nb,), float(block_size))
    rows[-1] = num_tokens - (nb - 1) * block_size
    kept = diagonal + (blocks_to_keep(nb, keep_fraction) - 1).float() * rows * block_size
    return float(kept.sum() / pairs.sum())


def scoring_flops_fraction(stride: int = ANTIDIAGONAL_STRIDE) -> float:
    """The scoring's FLOPs over dense causal attention's: a full (N/S, N/S) matmul of depth S D (2 N^2 D / S)
    against QK^T and PV over N^2 / 2 causal pairs (2 N^2 D): about 1 / stride."""
    return 1.0 / stride

