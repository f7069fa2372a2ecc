"""v8 block-sparse (``backends/sparse.py``): the textbook's tiles on v8's brgemm kernel, against the textbook's own
block-sparse attention in fp32 on the same tiles, and every tile kept is v8's dense answer, bit for bit."""

from __future__ import annotations

import pytest
import torch

from prefillviz.backends import sparse
from prefillviz.backends.ops import engine_ops
from prefillviz.backends.ops.paged_check import DEFAULT_TOLERANCE, random_step
from prefillviz.engine.errors import ConfigError
from prefillviz.engine.paged_attention import paged_sdpa
from prefillviz.engine.sparse_attention import (
    ANTIDIAGONAL_STRIDE,
    SPARSE_BLOCK_SIZE,
    antidiagonal_block_scores,
    block_sparse_attention,
    blocks_to_keep,
    select_blocks,
    sparse_requests,
)
from tests.model.test_paged_kernels import brgemm_runs

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2's


def step_rows(inputs) -> tuple:
    """q, k (T, heads, D) as the engine's forward hands them over: views of one q|k|v row."""
    q, k, v = (t.transpose(0, 1) for t in (inputs.q, inputs.k_new, inputs.v_new))
    rows = torch.cat([q, k, v], dim=1).contiguous()
    return rows[:, :HEADS], rows[:, HEADS : HEADS + KV_HEADS], rows[:, HEADS + KV_HEADS :]


def expected(inputs, keep: float) -> torch.Tensor:
    """The textbook's answer in fp32, (T, H D): its block-sparse attention for the fresh long prompts (on the tiles
    the textbook chooses from the step's q and k in fp32, as the backend scores them), SDPA for the rest."""
    q, k = inputs.q.float(), inputs.k_new.float()
    fp32 = [t.float() if isinstance(t, torch.Tensor) else t for t in inputs.arguments()]
    dense = paged_sdpa(*fp32)  # (H, T, D)
    step = inputs.step
    for r, is_sparse in enumerate(sparse_requests(step)):
        if is_sparse:
            rows = slice(step.query_start_loc[r], step.query_start_loc[r + 1])
            kept = select_blocks(antidiagonal_block_scores(q[:, rows], k[:, rows], inputs.scale), keep)  # fp32
            dense[:, rows] = block_sparse_attention(q[:, rows], k[:, rows], inputs.v_new[:, rows].float(),
                                                    inputs.scale, kept)
    return dense.transpose(0, 1).reshape(step.query_start_loc[-1], -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("requests", [
    pytest.param([(0, 1000)], id="a fresh prompt, its last block short"),
    pytest.param([(0, 256), (40, 9), (0, 700), (23, 1), (0, 100)], id="two fresh prompts, a chunk, a decode, a short"),
])
@pytest.mark.parametrize("keep", [0.3, 0.6])
def test_v8_block_sparse_is_the_textbooks_block_sparse(compiled_ops, dtype, requests, keep):
    brgemm_runs(dtype)
    inputs = random_step(requests, HEADS, KV_HEADS, HEAD_DIM, dtype=dtype, seed=3)
    q, k, _ = step_rows(inputs)
    got = sparse.v8_block_sparse(q, k, inputs.key_cache, inputs.value_cache, inputs.step, inputs.scale, keep)
    allowed = DEFAULT_TOLERANCE[dtype] * max(1.0, float(inputs.v_new.abs().max()))
    assert (got.float() - expected(inputs, keep)).abs().max() <= allowed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [300, 1000, 4096])  # a short last stride-row (300 = 18 x 16 + 12) and tile
def test_the_scores_are_the_textbooks_in_fp32(compiled_ops, dtype, num_tokens):
    brgemm_runs(dtype)
    inputs = random_step([(0, num_tokens)], HEADS, KV_HEADS, HEAD_DIM, dtype=dtype, seed=6)
    q, k, _ = step_rows(inputs)
    got = compiled_ops.antidiagonal_scores(q.reshape(num_tokens, -1), k.reshape(num_tokens, -1), HEADS, KV_HEADS,
                                           inputs.scale, ANTIDIAGONAL_STRIDE, SPARSE_BLOCK_SIZE)
    want = antidiagonal_block_scores(inputs.q.float(), inputs.k_new.float(), inputs.scale)
    allowed = sparse.scores_allowed_difference(inputs.q, inputs.k_new, inputs.scale)
    assert got.shape == want.shape and (got - want).abs().max() <= allowed
    for keep in (0.1, 0.3, 1.0):  # the textbook's selection, tie for tie
        counts = blocks_to_keep(want.shape[-1], keep)
        assert torch.equal(compiled_ops.select_tiles(got, counts).bool(), select_blocks(got, keep))
    ties = torch.zeros_like(got)  # every score equal: the lowest blocks win, after the sink and the diagonal
    assert torch.equal(compiled_ops.select_tiles(ties, blocks_to_keep(got.shape[-1], 0.3)).bool(),
                       select_blocks(ties, 0.3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keeping_every_tile_is_v8_dense_bit_for_bit(compiled_ops, dtype):
    brgemm_runs(dtype)
    inputs = random_step([(0, 1000), (30, 5)], HEADS, KV_HEADS, HEAD_DIM, dtype=dtype, seed=4)
    q, k, _ = step_rows(inputs)
    every = sparse.v8_block_sparse(q, k, inputs.key_cache, inputs.value_cache, inputs.step, inputs.scale, 1.0)
    slots, meta = engine_ops.step_meta(inputs.step)
    dense = compiled_ops.brgemm_paged(q.reshape(q.shape[0], -1), inputs.key_cache, inputs.value_cache, slots, meta,
                                      HEADS, inputs.scale)
    assert torch.equal(every, dense)


def test_a_map_for_a_request_with_cached_tokens_is_refused(compiled_ops):
    brgemm_runs(torch.float32)
    inputs = random_step([(300, 300)], HEADS, KV_HEADS, HEAD_DIM, seed=5)
    q, _, _ = step_rows(inputs)
    slots, meta = engine_ops.step_meta(inputs.step)
    kept = torch.ones(HEADS * 3 * 3, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="has cached tokens"):
        compiled_ops.brgemm_block_sparse(q.reshape(300, -1), inputs.key_cache, inputs.value_cache, slots, meta, HEADS,
                                         inputs.scale, kept, torch.zeros(1, dtype=torch.long), 128)


def test_the_choice_is_measured_and_says_why(compiled_ops):
    brgemm_runs(torch.bfloat16)
    choice = sparse.sparse_choice(HEADS, KV_HEADS, HEAD_DIM, torch.bfloat16, 0.2, torch.get_num_threads())
    if not choice.seconds:  # torch's own SDPA refused the textbook's masks here (ATEN_CPU_CAPABILITY=avx2 on AMX)
        assert choice.kernel == sparse.V8_SPARSE and "the textbook's version failed here" in choice.why
        return
    assert set(choice.seconds) == {sparse.V8_SPARSE, sparse.TEXTBOOK_SPARSE}
    assert choice.kernel == min(choice.seconds, key=choice.seconds.get)
    assert "faster than the" in choice.why and "measured" in choice.why


def test_where_v8_does_not_run_the_textbooks_version_runs(monkeypatch):
    monkeypatch.setattr(engine_ops, "brgemm_why", lambda *args: "v8 runs bf16 and fp32 only")
    choice = sparse.sparse_choice.__wrapped__(HEADS, KV_HEADS, HEAD_DIM, torch.float16, 0.2, 1)
    assert choice.kernel == sparse.TEXTBOOK_SPARSE and "v8 runs bf16 and fp32 only" in choice.why


@pytest.mark.parametrize("keep", [0, 1.5, True, "0.2"])
def test_an_impossible_keep_fraction_is_refused(keep):
    with pytest.raises(ConfigError, match="keep fraction must be in"):
        sparse.BlockSparseBackend(keep)
