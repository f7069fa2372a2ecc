"""What block-sparse prefill (``engine/sparse_attention.py``) computes and skips: tiles, (query, key) pairs, FLOPs.

A causal prompt of N tokens cut into tiles of B: the diagonal tiles hold B (B + 1) / 2 causal pairs
(the last block may be short), the tiles below it B x B. Dense attention computes every causal pair;
the block-sparse path only the kept tiles', plus the scoring's own matmul (about 1/stride of q k^T).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefillviz.engine.sparse_attention import ANTIDIAGONAL_STRIDE, SPARSE_BLOCK_SIZE, blocks_to_keep, num_blocks


@dataclass
class BlockSelection:
    """Which tiles each head computes, and the scores that chose them.

    Attributes:
        kept: (H, nb, nb) bool: query block i of head h computes key block j (``select_blocks``).
        scores: (H, nb, nb) fp32: the antidiagonal estimate of each tile's share of its query block's
            attention (``antidiagonal_block_scores``; each row sums to 1 over its causal blocks).
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


def tile_pairs(num_tokens: int, block_size: int) -> torch.Tensor:
    """(nb, nb) fp32: the causal (query, key) pairs in each tile (the last block may be short)."""
    nb = num_blocks(num_tokens, block_size)
    sizes = torch.full((nb,), float(block_size))
    sizes[-1] = num_tokens - (nb - 1) * block_size
    pairs = torch.tril(sizes[:, None] * sizes[None, :], diagonal=-1)
    return pairs + torch.diag(sizes * (sizes + 1) / 2)


def attention_flops_kept_fraction(num_tokens: int, keep_fraction: float, block_size: int = SPARSE_BLOCK_SIZE) -> float:
    """The share of a fresh prompt's causal attention pairs ``select_blocks`` computes. It does not depend on
    which blocks win: every kept block but the diagonal is a full one, off the diagonal."""
    nb = num_blocks(num_tokens, block_size)
    pairs = tile_pairs(num_tokens, block_size)
    rows = torch.full((nb,), float(block_size))
    rows[-1] = num_tokens - (nb - 1) * block_size
    kept = pairs.diagonal() + (blocks_to_keep(nb, keep_fraction) - 1).float() * rows * block_size
    return float(kept.sum() / pairs.sum())


def tiles_kept_fraction(num_tokens: int, keep_fraction: float, block_size: int = SPARSE_BLOCK_SIZE) -> float:
    """Kept tiles over causal tiles (the same for every head: each keeps as many per query block)."""
    nb = num_blocks(num_tokens, block_size)
    return float(blocks_to_keep(nb, keep_fraction).sum()) / (nb * (nb + 1) / 2)


def scoring_flops_fraction(stride: int = ANTIDIAGONAL_STRIDE) -> float:
    """The scoring's FLOPs over dense causal attention's: a full (N/S, N/S) matmul of depth S D (2 N^2 D / S)
    against QK^T and PV over N^2 / 2 causal pairs (2 N^2 D): about 1 / stride."""
    return 1.0 / stride
