"""The attention kernels against the naive oracle and against torch's SDPA: MHA and GQA,
N not a multiple of the block size, N = 1; and check_and_time refusing a wrong kernel."""

import pytest
import torch
import torch.nn.functional as F

from prefillviz.backends.ops.paged_check import KernelCheckError
from prefillviz.kernels.attention import (
    BLOCK_SIZE,
    BLOCKED,
    KERNELS,
    NAIVE,
    AttentionKernel,
    attention_blocked,
    attention_naive,
    check_and_time,
    get_kernel,
)
from prefillviz.kernels.harness import measure_peak_memory
from tests.tolerances import assert_within, attention_allowed_difference

SHAPES = [  # (H, KVH, N, D)
    pytest.param((4, 4, 37, 16), id="MHA"),
    pytest.param((9, 3, 70, 64), id="GQA, SmolLM2's heads, N not a multiple of 64"),
    pytest.param((6, 2, BLOCK_SIZE, 8), id="GQA, N = one block"),
    pytest.param((8, 1, 2 * BLOCK_SIZE + 1, 8), id="MQA, one token past two blocks"),
    pytest.param((4, 2, 1, 16), id="N = 1"),
]


def random_qkv(num_heads, num_kv_heads, num_tokens, head_dim, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(num_heads, num_tokens, head_dim, generator=generator)
    k = torch.randn(num_kv_heads, num_tokens, head_dim, generator=generator)
    v = torch.randn(num_kv_heads, num_tokens, head_dim, generator=generator)
    return q, k, v


def torch_reference(q, k, v, scale):
    """SDPA's math backend on K/V repeated to every query head: torch's own definition."""
    groups = q.shape[0] // k.shape[0]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return F.scaled_dot_product_attention(
            q[None], k.repeat_interleave(groups, 0)[None], v.repeat_interleave(groups, 0)[None], is_causal=True,
            scale=scale
        )[0]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kernel", KERNELS, ids=lambda kernel: kernel.name)
def test_every_kernel_equals_the_oracle_and_torch_sdpa(kernel, shape):
    q, k, v = random_qkv(*shape)
    scale = shape[3] ** -0.5
    out = kernel(q, k, v, scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    allowed = attention_allowed_difference(v, context=shape[2])
    assert_within(out, attention_naive(q, k, v, scale), allowed, "against the oracle")
    assert_within(out, torch_reference(q, k, v, scale), allowed, "against torch's SDPA")


def test_the_first_token_attends_only_to_itself_and_the_last_to_everything():
    q, k, v = random_qkv(3, 3, 10, 4)
    out = BLOCKED(q, k, v, 0.5)
    assert_within(out[:, 0], v[:, 0], attention_allowed_difference(v, context=1))  # softmax over one key = 1
    changed = v.clone()
    changed[:, -1] += 10.0  # the last token's value: only the last query may move
    moved = (BLOCKED(q, k, changed, 0.5) - out).abs().amax(dim=(0, 2))
    assert torch.all(moved[:-1] == 0) and moved[-1] > 0


def test_gqa_query_heads_share_kv_head_h_over_groups():
    q, k, v = random_qkv(6, 2, 20, 8)
    out = attention_blocked(q, k, v, 0.3, block_size=8)
    for head in range(6):  # head h with its own KV head alone is plain multi-head attention
        single = attention_naive(q[head : head + 1], k[head // 3 : head // 3 + 1], v[head // 3 : head // 3 + 1], 0.3)
        assert_within(out[head : head + 1], single, attention_allowed_difference(v, context=20), f"head {head}")


@pytest.mark.parametrize("block_size", [1, 7, 64, 256])
def test_blocked_kernel_is_right_for_any_block_size(block_size):
    q, k, v = random_qkv(4, 2, 50, 8)
    assert_within(
        attention_blocked(q, k, v, 0.35, block_size), attention_naive(q, k, v, 0.35),
        attention_allowed_difference(v, context=50),
    )


def test_check_and_time_reports_a_checked_timed_kernel():
    q, k, v = random_qkv(9, 3, 96, 64)
    result = check_and_time(BLOCKED, q, k, v, 0.125, runs=2, warmup=1)
    assert result.kernel == "v3 blocked" and (
        (result.num_heads, result.num_kv_heads, result.num_tokens, result.head_dim) == (9, 3, 96, 64)
    )
    # the check allows no less than fp32 needs
    assert result.max_abs_diff <= attention_allowed_difference(v, context=96) <= result.allowed_diff
    timing = result.timing
    assert 0 < timing.min_s <= timing.median_s <= timing.max_s and timing.num_runs == 2
    assert result.output_bytes == 9 * 96 * 64 * 4
    assert result.largest_intermediate_bytes == 9 * 64 * 64 * 4  # one fp32 tile, not 96 x 96
    assert NAIVE.largest_intermediate(9, 96, 4) == 9 * 96 * 96 * 4
    assert result.peak_memory_bytes >= result.output_bytes  # measured: the output is allocated in the call


def test_naive_kernel_really_holds_the_n_by_n_scores_and_blocked_does_not():
    q, k, v = random_qkv(9, 3, 256, 64)
    scores_bytes = 9 * 256 * 256 * 4
    naive_bytes, method = measure_peak_memory(lambda: NAIVE(q, k, v, 0.125), q.device)
    blocked_bytes, _ = measure_peak_memory(lambda: BLOCKED(q, k, v, 0.125), q.device)
    assert method == "torch.profiler allocation events"
    assert naive_bytes >= scores_bytes  # measured by the allocator, not computed
    assert blocked_bytes < scores_bytes


def not_causal(q, k, v, scale):
    groups = q.shape[0] // k.shape[0]
    return F.scaled_dot_product_attention(
        q[None], k.repeat_interleave(groups, 0)[None], v.repeat_interleave(groups, 0)[None], scale=scale
    )[0]


def test_check_and_time_refuses_a_kernel_that_is_not_causal():
    q, k, v = random_qkv(9, 3, 33, 16)
    wrong = AttentionKernel("v0 not causal", 0, "forgets the mask", not_causal, lambda *args: None)
    with pytest.raises(KernelCheckError, match="differs from the naive oracle"):
        check_and_time(wrong, q, k, v, 0.25, runs=1)


def test_check_and_time_refuses_a_wrong_shape_and_inconsistent_inputs():
    q, k, v = random_qkv(4, 2, 12, 8)
    transposed = AttentionKernel(
        "v0 transposed", 0, "returns (N, H, D)", lambda q, k, v, s: attention_naive(q, k, v, s).transpose(0, 1),
        lambda *a: None,
    )
    with pytest.raises(KernelCheckError, match="shape"):
        check_and_time(transposed, q, k, v, 0.3, runs=1)
    with pytest.raises(KernelCheckError, match="multiple of KVH"):
        check_and_time(BLOCKED, q[:3], k, v, 0.3, runs=1)


def test_get_kernel_by_name():
    assert get_kernel("v2 sdpa").version == 2
    with pytest.raises(KeyError):
        get_kernel("v9 imaginary")


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda kernel: kernel.name)
def test_bfloat16_kernels_pass_the_check_against_the_fp32_oracle(kernel):
    q, k, v = (t.to(torch.bfloat16) for t in random_qkv(9, 3, 70, 64))
    result = check_and_time(kernel, q, k, v, 0.125, runs=1, warmup=1, measure_memory=False)
    assert result.dtype == "bfloat16" and result.max_abs_diff <= result.allowed_diff
    # P and the output rounded to bf16, a step each (v1's bf16 scores too: their errors average over the keys)
    assert result.max_abs_diff <= attention_allowed_difference(v, context=70)
