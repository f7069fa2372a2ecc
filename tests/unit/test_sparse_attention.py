"""Block-sparse prefill (engine/sparse_attention.py): which tiles it keeps, and that it computes exactly those."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prefillviz.engine.errors import ConfigError
from prefillviz.engine.paged_attention import PagedStep, paged_naive
from prefillviz.engine.sparse_attention import (
    antidiagonal_block_scores,
    block_sparse_attention,
    block_sparse_backend,
    blocks_to_keep,
    paged_sparse_prefill,
    select_blocks,
    sparse_prefill,
)
from prefillviz.experiments.sparse_work import BlockSelection, attention_flops_kept_fraction
from tests.tolerances import OP_STEPS, allowed_difference, assert_within

BLOCK, STRIDE = 8, 4


def random_qkv(n: int, heads: int = 4, kv_heads: int = 2, dim: int = 16, dtype=torch.float32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, n, dim, generator=generator).to(dtype)
    k = torch.randn(kv_heads, n, dim, generator=generator).to(dtype)
    v = torch.randn(kv_heads, n, dim, generator=generator).to(dtype)
    return q, k, v


def block_masked_oracle(q, k, v, scale, kept, block):
    """Plain softmax(q k^T) v in fp32 with every pair outside a kept tile, or in the future, masked."""
    n = q.shape[1]
    k, v = (x.float().repeat_interleave(q.shape[0] // k.shape[0], dim=0) for x in (k, v))
    position = torch.arange(n)
    tile = kept[:, position[:, None] // block, position[None, :] // block]  # (H, n, n)
    allowed = tile & (position[None, :] <= position[:, None])
    scores = (q.float() @ k.transpose(-1, -2)) * scale
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


def test_selection_keeps_the_sink_and_the_diagonal_and_nothing_in_the_future():
    generator = torch.Generator().manual_seed(1)
    scores = torch.rand(3, 7, 7, generator=generator)
    kept = select_blocks(scores, 0.3)
    assert kept[:, :, 0].all()  # the sink, every query block
    assert kept[:, torch.arange(7), torch.arange(7)].all()  # the diagonal
    assert not kept.triu(1).any()  # causal: no key block after the query block
    assert kept.sum(-1).tolist() == [blocks_to_keep(7, 0.3).tolist()] * 3
    assert blocks_to_keep(7, 0.3).tolist() == [1, 2, 2, 2, 2, 2, 3]  # ceil(0.3 (i + 1)), at least 2


def test_selection_picks_the_highest_scores():
    scores = torch.zeros(1, 6, 6)
    scores[0, 5, 3] = 0.9  # query block 5 looks at key block 3 most, then 1
    scores[0, 5, 1] = 0.5
    kept = select_blocks(scores, 0.5)  # ceil(0.5 x 6) = 3: the sink, the diagonal and block 3
    assert kept[0, 5].nonzero().flatten().tolist() == [0, 3, 5]


def test_keep_everything_keeps_every_causal_tile():
    scores = torch.rand(2, 5, 5)
    kept = select_blocks(scores, 1.0)
    assert torch.equal(kept, torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 5, 5))
    with pytest.raises(ValueError):
        select_blocks(scores, 0.0)


def antidiagonal_oracle(q, k, scale, block, stride):
    """The XAttention estimate written out with loops: each (stride x stride) square's antidiagonal sum of
    q k^T, a causal softmax over squares, summed per tile and normalised per query block."""
    heads, n, _ = q.shape
    k = k.repeat_interleave(heads // k.shape[0], dim=0)
    rows = n // stride
    sums = torch.zeros(heads, rows, rows)
    for a in range(rows):
        for b in range(rows):
            for i in range(stride):
                sums[:, a, b] += (q[:, a * stride + stride - 1 - i] * k[:, b * stride + i]).sum(-1)
    sums = (sums * scale / stride).masked_fill(torch.ones(rows, rows, dtype=torch.bool).triu(1), float("-inf"))
    probs = torch.softmax(sums, dim=-1)
    per = block // stride
    tiles = probs.view(heads, rows // per, per, rows // per, per).sum(dim=(2, 4))
    return tiles / tiles.sum(-1, keepdim=True)


def test_antidiagonal_scores_match_the_loops():
    q, k, _ = random_qkv(32)
    scores = antidiagonal_block_scores(q, k, 0.25, BLOCK, STRIDE)
    assert_within(scores, antidiagonal_oracle(q, k, 0.25, BLOCK, STRIDE), 1e-5, "antidiagonal block scores")
    assert torch.allclose(scores.sum(-1), torch.ones(4, 4))
    assert not scores.triu(1).any()


def test_a_ragged_prompt_scores_its_short_last_block():
    q, k, _ = random_qkv(29)  # 4 blocks, the last of 5 tokens
    scores = antidiagonal_block_scores(q, k, 0.25, BLOCK, STRIDE)
    assert scores.shape == (4, 4, 4) and torch.allclose(scores.sum(-1), torch.ones(4, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [40, 37])
def test_keep_everything_equals_dense_attention(dtype, n):
    q, k, v = random_qkv(n, dtype=dtype)
    out = sparse_prefill(q, k, v, 0.25, 1.0, BLOCK, STRIDE)
    dense = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=0.25, enable_gqa=True)[0]
    assert_within(out, dense, allowed_difference(dtype, v, OP_STEPS, terms=n), f"keep 1.0, N={n}, {dtype}")
    scores = antidiagonal_block_scores(q, k, 0.25, BLOCK, STRIDE)
    selection = BlockSelection(select_blocks(scores, 1.0), scores, n, BLOCK)
    assert selection.tiles_kept_fraction() == 1.0 and selection.pairs_kept_fraction() == 1.0


@pytest.mark.parametrize("n", [48, 45])
def test_sparse_attention_computes_exactly_the_kept_tiles(n):
    q, k, v = random_qkv(n)
    nb = -(-n // BLOCK)
    kept = torch.eye(nb, dtype=torch.bool).expand(4, nb, nb).clone()
    kept[:, :, 0] = True  # sink and diagonal only ...
    for head, (in_row_5, in_row_4) in enumerate([(1, 2), (2, 1), (3, 3), (4, 1)]):  # and one more in rows 5 and 4
        kept[head, 5, in_row_5] = kept[head, 4, in_row_4] = True  # (every head keeps as many in a row)
    out = block_sparse_attention(q, k, v, 0.25, kept, BLOCK)
    allowed = allowed_difference(torch.float32, v, OP_STEPS, n)
    assert_within(out, block_masked_oracle(q, k, v, 0.25, kept, BLOCK), allowed, "kept tiles vs the masked oracle")
    dense = block_masked_oracle(q, k, v, 0.25, torch.ones(nb, nb, dtype=torch.bool).tril().expand(4, nb, nb), BLOCK)
    assert (out - dense).abs().max() > 1e-3  # skipping tiles changes the answer: the test can tell


def test_flop_fraction_does_not_depend_on_which_blocks_win():
    q, k, v = random_qkv(45)
    scores = antidiagonal_block_scores(q, k, 0.25, BLOCK, STRIDE)
    selection = BlockSelection(select_blocks(scores, 0.4), scores, 45, BLOCK)
    assert selection.pairs_kept_fraction() == pytest.approx(attention_flops_kept_fraction(45, 0.4, BLOCK))
    assert 0 < selection.score_mass_kept() <= 1


def test_a_step_runs_sparse_for_a_fresh_prompt_and_dense_for_a_decode():
    """One step: a fresh 40-token prompt (sparse) and a decode after 10 cached tokens (dense), at keep 1.0."""
    heads, kv_heads, dim = 4, 2, 16
    key_cache, value_cache = torch.randn(8, BLOCK, kv_heads, dim), torch.randn(8, BLOCK, kv_heads, dim)
    slots = torch.arange(40)
    decode_slots = torch.arange(48, 59)
    step = PagedStep([0, 40, 41], [0, 10], torch.cat([slots, decode_slots[-1:]]), [None, decode_slots])
    q = torch.randn(heads, 41, dim)
    k_new = key_cache.view(-1, kv_heads, dim)[step.slot_mapping].transpose(0, 1)
    v_new = value_cache.view(-1, kv_heads, dim)[step.slot_mapping].transpose(0, 1)
    out = paged_sparse_prefill(q, k_new, v_new, key_cache, value_cache, step, 0.25, 1.0, paged_naive, BLOCK, STRIDE)
    reference = paged_naive(q, k_new, v_new, key_cache, value_cache, step, 0.25)
    assert_within(out, reference, allowed_difference(torch.float32, v_new, OP_STEPS, 40), "mixed step, keep 1.0")
    sparse = paged_sparse_prefill(q, k_new, v_new, key_cache, value_cache, step, 0.25, 0.2, paged_naive, BLOCK, STRIDE)
    assert torch.equal(sparse[:, 40:], reference[:, 40:])  # the decode row stays dense
    assert not torch.allclose(sparse[:, :40], reference[:, :40])


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, True, float("nan")])
def test_the_sparse_backend_refuses_a_keep_fraction_outside_0_to_1(bad):
    with pytest.raises(ConfigError, match="keep fraction must be in"):
        block_sparse_backend(bad)
    assert block_sparse_backend(1).name == "torch"
