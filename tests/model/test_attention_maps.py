"""Attention maps rebuilt from captured q/k against what eager attention really computed.

The headline check: for the tiny random Llama and the bundled SmolLM2, ``attention_probs``
from post-RoPE q/k equals ``output_attentions`` of an eager forward for every head
(fp32, within the few fp32 steps two forward passes differ by). The rest pins the chunk slicing, the blocked
summaries, the pooled map and the chunk strips on inputs where the answer is known.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from prefillviz.analysis.attention_maps import (
    ChunkStrip,
    all_head_summaries,
    attention_probs,
    causal_chunk_strips,
    head_summaries,
    pooled_attention_map,
)
from tests.tolerances import OP_STEPS, allowed_difference, maps_allowed_difference

CAPTURE_NAME = "capture_test"
_captured: dict[int, tuple[torch.Tensor, torch.Tensor, float]] = {}


def _capture_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    _captured[module.layer_idx] = (query[0].clone(), key[0].clone(), module.scaling)  # (H, N, D), (KVH, N, D)
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


AttentionInterface.register(CAPTURE_NAME, _capture_attention)
AttentionMaskInterface.register(CAPTURE_NAME, sdpa_mask)


@contextmanager
def attention_implementation(model, name):
    """Switch a shared fixture model's attention; always put the previous one back."""
    previous = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = previous


@torch.inference_mode()
def capture_and_eager(model, token_ids):
    """Post-RoPE q/k/scaling per layer (through SDPA) and the eager attention probabilities."""
    input_ids = torch.tensor([token_ids])
    _captured.clear()
    with attention_implementation(model, CAPTURE_NAME):
        model(input_ids=input_ids, logits_to_keep=1)
    captured = dict(_captured)
    _captured.clear()
    with attention_implementation(model, "eager"):
        eager = model(input_ids=input_ids, logits_to_keep=1, output_attentions=True).attentions
    return captured, eager


def max_difference_to_eager(captured, eager, layers):
    worst = 0.0
    for layer in layers:
        q, k, scaling = captured[layer]
        for head in range(q.shape[0]):
            rebuilt = attention_probs(q, k, head, scaling)
            assert rebuilt.shape == eager[layer][0, head].shape
            worst = max(worst, (rebuilt - eager[layer][0, head].float()).abs().max().item())
    return worst


def test_tiny_model_maps_match_eager_attention(tiny_llama):
    token_ids = torch.randint(3, 128, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    captured, eager = capture_and_eager(tiny_llama, token_ids)
    assert tiny_llama.config._attn_implementation == "sdpa"
    assert sorted(captured) == [0, 1]
    q, k, _ = captured[0]
    assert q.shape == (4, 40, 16) and k.shape == (2, 40, 16)  # GQA: 2 query heads per KV head
    difference = max_difference_to_eager(captured, eager, layers=[0, 1])
    allowed = maps_allowed_difference(tiny_llama, len(token_ids))
    assert difference <= allowed, f"max |rebuilt - eager| = {difference:.2e} > {allowed:.2e}"


def test_bundled_model_maps_match_eager_attention(bundled):
    text = (
        "During prefill the model reads the whole prompt in one pass, and the keys and values of "
        "every prompt token are written into the KV cache once."
    )
    token_ids = bundled.tokenizer(text)["input_ids"]
    assert 20 <= len(token_ids) <= 40
    captured, eager = capture_and_eager(bundled.model, token_ids)
    assert bundled.model.config._attn_implementation == "sdpa"
    assert len(captured) == 30
    difference = max_difference_to_eager(captured, eager, layers=range(30))
    allowed = maps_allowed_difference(bundled.model, len(token_ids))
    assert difference <= allowed, f"max |rebuilt - eager| = {difference:.2e} > {allowed:.2e}"


def random_qk(num_heads=4, num_kv_heads=2, num_tokens=30, head_dim=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(num_heads, num_tokens, head_dim, generator=generator) * 2  # (H, N, D)
    k = torch.randn(num_kv_heads, num_tokens, head_dim, generator=generator) * 2  # (KVH, N, D)
    return q, k


def test_chunk_rows_equal_the_slice_of_the_full_map():
    q, k = random_qk()
    full = attention_probs(q, k, head=3, scaling=8**-0.5)
    chunk = attention_probs(q, k, head=3, scaling=8**-0.5, query_start=10, query_end=20)
    assert chunk.shape == (10, 20)
    torch.testing.assert_close(chunk, full[10:20, :20])
    assert torch.all(full.triu(diagonal=1) == 0)
    torch.testing.assert_close(full.sum(dim=1), torch.ones(30))


def test_numpy_and_half_inputs_are_computed_in_fp32():
    q, k = random_qk()
    expected = attention_probs(q, k, head=1, scaling=0.3)
    from_numpy = attention_probs(q.numpy(), k.numpy(), head=1, scaling=0.3)
    from_half = attention_probs(q.half(), k.half(), head=1, scaling=0.3)
    assert from_numpy.dtype == from_half.dtype == torch.float32
    torch.testing.assert_close(from_numpy, expected)
    # fp16 q and k (half a step each) move each score by at most a step at scaling x sum_d |q_d k_d|, and
    # the softmax moves p_j by (ds_j - sum_i p_i ds_i) p_j, at most 2 p_j (1 - p_j) max |ds| <= max |ds| / 2
    score_size = 0.3 * (q[1].abs() @ k[0].abs().T).max()  # head 1 reads KV head 0
    torch.testing.assert_close(from_half, expected, atol=allowed_difference(torch.float16, score_size, 1) / 2, rtol=0)


def test_uniform_attention_has_known_summaries():
    num_tokens = 50
    q, k = torch.zeros(3, num_tokens, 8), torch.randn(1, num_tokens, 8)  # q = 0: every row uniform
    summary = head_summaries(q, k, scaling=0.125, block_rows=16)
    rows = np.arange(num_tokens)
    # fp32 sums over a row, and over the rows
    relative = allowed_difference(torch.float32, 1.0, OP_STEPS, terms=num_tokens)
    np.testing.assert_allclose(summary.entropy, np.full(3, np.log(rows + 1).mean()), rtol=relative)
    np.testing.assert_allclose(summary.mean_lookback, np.full(3, (rows / 2).mean()), rtol=relative)
    np.testing.assert_allclose(summary.sink, np.full(3, (1 / (rows[1:] + 1)).mean()), rtol=relative)


def test_blocked_summaries_equal_full_matrix_computation():
    q, k = random_qk(num_tokens=70)
    scaling = 8**-0.5
    summary = head_summaries(q, k, scaling, block_rows=16)  # 70 rows: 4 full blocks + 6
    rows = torch.arange(70)[:, None]
    distance = (rows - torch.arange(70)[None, :]).clamp(min=0).float()
    relative = allowed_difference(torch.float32, 1.0, OP_STEPS, terms=70)  # the same sums, in blocks of rows
    for head in range(4):
        p = attention_probs(q, k, head, scaling)  # (N, N)
        entropy = -(torch.special.xlogy(p, p)).sum(dim=1).mean()
        assert summary.entropy[head] == pytest.approx(entropy.item(), rel=relative)
        assert summary.sink[head] == pytest.approx(p[1:, 0].mean().item(), rel=relative)
        assert summary.mean_lookback[head] == pytest.approx((p * distance).sum(dim=1).mean().item(), rel=relative)


def test_all_head_summaries_stack_layers():
    layers = [random_qk(seed=s) for s in range(3)]
    stacked = all_head_summaries([q for q, _ in layers], [k for _, k in layers], [0.3, 0.3, 0.3])
    assert set(stacked) == {"entropy", "sink", "mean_lookback"}
    assert all(array.shape == (3, 4) for array in stacked.values())
    np.testing.assert_allclose(stacked["sink"][2], head_summaries(*layers[2], 0.3).sink)


# the pooled map's probabilities against attention_probs' own: softmax rows of 8-dim scores, computed in
# other blocks (a max of them is exact), so at most a few fp32 roundings of a probability (<= 1)
PROBABILITY_ROUNDINGS = allowed_difference(torch.float32, 1.0, OP_STEPS, terms=8)


def test_pooled_map_is_exact_for_short_prompts():
    q, k = random_qk(num_tokens=60)
    pooled, edges = pooled_attention_map(q, k, head=2, scaling=0.3, max_size=64)
    assert pooled.dtype == np.float32
    np.testing.assert_allclose(pooled, attention_probs(q, k, 2, 0.3).numpy(), rtol=0, atol=PROBABILITY_ROUNDINGS)
    np.testing.assert_array_equal(edges, np.arange(61))


@pytest.mark.parametrize("num_tokens, max_size", [(1000, 100), (1001, 100)])
def test_pooled_map_takes_the_block_max(num_tokens, max_size):
    q, k = random_qk(num_heads=2, num_kv_heads=1, num_tokens=num_tokens, head_dim=8)
    pooled, edges = pooled_attention_map(q, k, head=1, scaling=0.5, max_size=max_size)
    bin_size = math.ceil(num_tokens / max_size)
    num_bins = math.ceil(num_tokens / bin_size)
    assert pooled.shape == (num_bins, num_bins) and len(edges) == num_bins + 1
    assert edges[0] == 0 and edges[-1] == num_tokens
    exact = attention_probs(q, k, 1, 0.5).numpy()
    expected = np.zeros_like(pooled)
    for r in range(num_bins):
        for c in range(num_bins):
            expected[r, c] = exact[edges[r] : edges[r + 1], edges[c] : edges[c + 1]].max()
    np.testing.assert_allclose(pooled, expected, rtol=0, atol=PROBABILITY_ROUNDINGS)
    assert np.all(np.triu(pooled, k=1) == 0)  # bins fully above the diagonal stay masked


def test_chunk_strips_cover_rows_and_their_context():
    expected = [ChunkStrip(0, 0, 7, 0, 7), ChunkStrip(1, 7, 14, 0, 14), ChunkStrip(2, 14, 20, 0, 20)]
    assert causal_chunk_strips([0, 7, 14, 20], 20) == expected
    assert causal_chunk_strips([0, 7, 14], 20) == expected  # the end may be left out
    assert causal_chunk_strips([16], 20) == [ChunkStrip(0, 16, 20, 0, 20)]  # after a prefix-cache hit
    with pytest.raises(ValueError):
        causal_chunk_strips([0, 14, 7], 20)
