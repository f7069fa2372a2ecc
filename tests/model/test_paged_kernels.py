"""The paged attention kernels of one engine step (prefillviz/kernels/paged_attention.py): the naive
oracle against plain causal SDPA over each request's whole sequence, every other version
against the oracle on fresh prompts, chunks after cached context, decodes and a mix of
all three; the block-diagonal mask spelled out; and the check refusing a wrong kernel."""

import pytest
import torch
import torch.nn.functional as F

from prefillviz.backends.dispatch import ATTENTION_CANDIDATES
from prefillviz.backends.ops.engine_ops import brgemm_problem
from prefillviz.backends.ops.paged_check import KernelCheckError
from prefillviz.kernels.paged_attention import (
    BRGEMM,
    COMPILED,
    COMPILED_TILES,
    FLEX,
    LOOP,
    LOOP_FP32_DECODES,
    NAIVE,
    PACKED,
    PAGED_KERNELS,
    TRITON,
    PagedKernel,
    check_paged,
    check_paged_and_time,
    decode_fp32,
    flex_status,
    get_paged_kernel,
    packed_mask,
    paged_naive,
    random_step,
)
from tests.tolerances import OP_STEPS, allowed_difference, assert_within, attention_allowed_difference

STEPS = [  # [(cached, new), ...] per request
    pytest.param([(0, 37)], id="one fresh prompt"),
    pytest.param([(40, 9)], id="a chunk after cached context"),
    pytest.param([(17, 1), (33, 1), (5, 1)], id="three decodes"),
    pytest.param([(20, 1), (0, 23), (31, 12), (64, 1)], id="decode + fresh prompt + chunk + decode"),
]
HEADS = [pytest.param((4, 4, 16), id="MHA"), pytest.param((9, 3, 64), id="GQA, SmolLM2's heads")]


def allowed_for(inputs):
    """How far two computations of this step's attention may differ, in its dtype: a weighted mean of
    its cached and new values, summed over its longest context (``attention_allowed_difference``)."""
    step = inputs.step
    context = max(
        cached + end - start
        for cached, start, end in zip(step.num_computed, step.query_start_loc, step.query_start_loc[1:])
    )
    return attention_allowed_difference(inputs.value_cache, context)


def whole_sequence_reference(inputs, r):
    """Request r's new rows, from plain causal SDPA over its whole sequence (its cached
    positions get random queries of their own; causality makes them irrelevant to the new rows)."""
    step = inputs.step
    slots = step.slots(r)
    keys = inputs.key_cache.view(-1, *inputs.key_cache.shape[2:])[slots].transpose(0, 1)  # (KVH, ctx, D)
    values = inputs.value_cache.view(-1, *inputs.value_cache.shape[2:])[slots].transpose(0, 1)
    start, end, cached = step.query_start_loc[r], step.query_start_loc[r + 1], step.num_computed[r]
    earlier = torch.randn(inputs.q.shape[0], cached, inputs.q.shape[2])
    queries = torch.cat([earlier, inputs.q[:, start:end]], dim=1)
    out = F.scaled_dot_product_attention(
        queries[None], keys[None], values[None], is_causal=True, scale=inputs.scale, enable_gqa=True
    )
    return out[0, :, cached:]


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("requests", STEPS)
@pytest.mark.parametrize("block_size", [16, 5])
def test_oracle_equals_causal_attention_over_each_whole_sequence(requests, heads, block_size):
    inputs = random_step(requests, *heads, block_size=block_size, seed=3)
    got = paged_naive(*inputs.arguments())
    for r in range(inputs.step.num_requests):
        start, end = inputs.step.query_start_loc[r], inputs.step.query_start_loc[r + 1]
        assert_within(got[:, start:end], whole_sequence_reference(inputs, r), allowed_for(inputs), f"request {r}")


@pytest.mark.parametrize("kernel", [LOOP, PACKED, LOOP_FP32_DECODES], ids=lambda k: k.name)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("requests", STEPS)
def test_torch_kernels_match_the_oracle(kernel, requests, heads):
    inputs = random_step(requests, *heads, block_size=16, seed=1)
    difference, allowed = check_paged(kernel, inputs)
    assert difference <= allowed_for(inputs) <= allowed  # the check allows no less than fp32 needs


@pytest.mark.parametrize("heads", [*HEADS, pytest.param((8, 1, 32), id="MQA")])
@pytest.mark.parametrize(
    "requests", [*STEPS, pytest.param([(0, 100), (70, 45), (130, 1)], id="several query blocks and key tiles")]
)
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("kernel", [COMPILED, COMPILED_TILES], ids=["rows across lanes", "key tiles"])
def test_compiled_kernel_matches_the_oracle(compiled_ops, requests, heads, block_size, kernel):
    inputs = random_step(requests, *heads, block_size=block_size, seed=1)
    difference, allowed = check_paged(kernel, inputs)
    assert difference <= allowed_for(inputs) <= allowed


@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_kernel_with_32_token_tasks(compiled_ops, threads):
    """A long fp32 prompt gets tasks of 32 query tokens where each thread still has four (one
    thread: 200 tokens x 3 KV heads make 18); the tasks of 16 tokens are the test above's."""
    inputs = random_step([(0, 200), (64, 150)], 9, 3, 64, block_size=16, seed=4)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        difference, allowed = check_paged(COMPILED, inputs)
    finally:
        torch.set_num_threads(before)
    assert difference <= allowed_for(inputs) <= allowed


@pytest.mark.parametrize("kernel", [COMPILED, COMPILED_TILES], ids=["rows across lanes", "key tiles"])
def test_compiled_kernel_in_bf16_and_its_status(compiled_ops, kernel):
    inputs = random_step([(20, 1), (0, 40), (30, 10)], 9, 3, 64, dtype=torch.bfloat16)
    has_dot_products = compiled_ops.bf16_dot_products()
    outputs = []
    try:
        # fp32 tiles; AVX512-BF16 dot products where the CPU has them
        for on in [False, True] if has_dot_products else [False]:
            compiled_ops.set_bf16_dot_products(on)
            difference, allowed = check_paged(kernel, inputs)
            assert 0 < difference <= min(allowed, allowed_for(inputs))  # P and the output rounded to bf16: a step each
            outputs.append(kernel(*inputs.arguments()))
    finally:
        compiled_ops.set_bf16_dot_products(has_dot_products)
    # the dot products are another arithmetic (P in bf16), in key tiles: the decode's in either kernel
    assert len(outputs) == 1 or not torch.equal(*outputs)
    lanes, tiles = COMPILED(*inputs.arguments()), COMPILED_TILES(*inputs.arguments())
    assert torch.equal(lanes[:, :1], tiles[:, :1])  # the decode's three rows fill no vector: key tiles in both
    # the prompt's and the chunk's rows: P in fp32 across v7's lanes, in bf16 in the tiles' dot products
    if has_dot_products:
        assert not torch.equal(lanes[:, 1:], tiles[:, 1:])
    assert COMPILED.status("cpu") == (True, COMPILED.status("cpu")[1]) and "C++ ops" in COMPILED.status("cpu")[1]
    assert not COMPILED.status("cuda")[0]


def brgemm_runs(dtype: torch.dtype):
    from prefillviz.backends import dispatch_tuning

    why = dispatch_tuning.brgemm_why(torch.device("cpu"), dtype, 64)
    if why:
        pytest.skip(f"v8 can't run {dtype} here: {why}")


@pytest.mark.parametrize(
    "heads",
    [
        pytest.param((9, 3, 64), id="GQA, SmolLM2's heads"), pytest.param((8, 1, 64), id="MQA"),
        pytest.param((4, 4, 128), id="MHA, head size 128"),
    ],
)
@pytest.mark.parametrize(
    "requests",
    [
        *STEPS, pytest.param([(0, 100), (70, 45), (130, 1)], id="several query blocks"),
        pytest.param([(500, 300), (0, 333)], id="several key blocks, keys past a pack block"),
    ],
)
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_brgemm_kernel_matches_the_oracle(compiled_ops, requests, heads, block_size, dtype):
    """v8 against the fp32 oracle. bf16: its QK^T is exact in fp32 sums, P and the output are rounded to bf16 (a
    step each), so it differs. fp32: fp32 sums in other orders and an exp to 1.5 ulp, within fp32's bound."""
    brgemm_runs(dtype)
    inputs = random_step(requests, *heads, block_size=block_size, dtype=dtype, seed=3)
    difference, allowed = check_paged(BRGEMM, inputs)
    assert difference <= min(allowed, allowed_for(inputs))
    assert difference > 0 or dtype == torch.float32


@pytest.mark.parametrize("threads", [1, 3, 5])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_brgemm_kernel_at_the_thread_counts_of_other_machines(compiled_ops, threads, dtype):
    """A machine with more cores than CI's two splits v8's tasks into more runs (a thread done with its
    own takes from the others'); one thread runs them all. A task (a request's head and 64 query rows)
    is one thread's whole, in the same calls whoever runs it: the same bits as at the default count."""
    brgemm_runs(dtype)
    inputs = random_step([(0, 200), (64, 150), (30, 1)], 9, 3, 64, block_size=16, dtype=dtype, seed=6)
    by_default = BRGEMM(*inputs.arguments())  # CI's two threads; a test machine's own count
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        difference, allowed = check_paged(BRGEMM, inputs)
        got = BRGEMM(*inputs.arguments())
    finally:
        torch.set_num_threads(before)
    assert difference <= min(allowed, allowed_for(inputs))
    assert torch.equal(got, by_default)


def test_brgemm_kernel_refuses_what_it_cannot_run(compiled_ops, tiny_llama):
    from prefillviz.backends import dispatch_tuning

    inputs = random_step([(0, 40)], 9, 3, 64, dtype=torch.float16, seed=3)
    with pytest.raises(RuntimeError, match="bf16 or fp32"):
        BRGEMM(*inputs.arguments())
    assert dispatch_tuning.brgemm_why(torch.device("cpu"), torch.float16, 64) == "v8 runs bf16 and fp32 only"
    # the tiny Llama's heads are 16 wide
    assert "multiple of 64" in dispatch_tuning.candidate_statuses(tiny_llama.float())["attention"]["v8 brgemm"]
    assert "multiple of 64" in dispatch_tuning.brgemm_why(torch.device("cpu"), torch.bfloat16, 16)
    # where oneDNN packs bf16, v8's own packing writes what its pack writes
    assert "another layout" not in brgemm_problem("bfloat16")
    runs, why = BRGEMM.status("cpu")
    assert why and (runs or "oneDNN" in why or "C++ ops" in why)  # where it can't run, it says which part is missing


def test_the_oracle_in_row_blocks_is_the_same_arithmetic():
    inputs = random_step([(50, 70), (0, 33)], 6, 2, 16, seed=2)
    whole = paged_naive(*inputs.arguments())
    # the same sums, in matmuls of other shapes
    assert_within(paged_naive(*inputs.arguments(), row_block=8), whole, allowed_for(inputs))


def test_packed_mask_is_block_diagonal_and_causal_with_offsets():
    inputs = random_step([(2, 1), (0, 2), (1, 2)], 2, 1, 4)
    # keys: request 0 positions 0-2, request 1 positions 0-1, request 2 positions 0-2
    expected = torch.tensor(
        [
            [1, 1, 1, 0, 0, 0, 0, 0],  # request 0, position 2 (a decode)
            [0, 0, 0, 1, 0, 0, 0, 0],  # request 1, position 0 (fresh)
            [0, 0, 0, 1, 1, 0, 0, 0],  # request 1, position 1
            [0, 0, 0, 0, 0, 1, 1, 0],  # request 2, position 1 (after 1 cached)
            [0, 0, 0, 0, 0, 1, 1, 1],  # request 2, position 2
        ],
        dtype=torch.bool,
    )
    assert torch.equal(packed_mask(inputs.step, torch.device("cpu")), expected)


def test_bf16_kernels_pass_their_looser_check():
    inputs = random_step([(20, 1), (0, 40), (30, 10)], 9, 3, 64, dtype=torch.bfloat16)
    for kernel in (LOOP, PACKED, LOOP_FP32_DECODES):
        difference, allowed = check_paged(kernel, inputs)
        assert 0 < difference <= min(allowed, allowed_for(inputs))  # P and the output rounded to bf16: a step each


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(9, 3), (4, 4), (8, 1)], ids=["GQA", "MHA", "MQA"])
def test_fp32_decode_matches_sdpa_in_fp32_and_rounds_like_it_in_bf16(heads, dtype):
    generator = torch.Generator().manual_seed(6)
    q = torch.randn(heads[0], 1, 64, generator=generator).to(dtype)
    k, v = (torch.randn(heads[1], 300, 64, generator=generator).to(dtype) for _ in range(2))
    exact = F.scaled_dot_product_attention(
        q[None].float(), k[None].float(), v[None].float(), scale=0.125, enable_gqa=True
    )[0]
    got = decode_fp32(q, k, v, 0.125)
    assert got.dtype == dtype and got.shape == q.shape
    sdpa_error = (
        F.scaled_dot_product_attention(q[None], k[None], v[None], scale=0.125, enable_gqa=True)[0].float() - exact
    ).abs().max()
    # below this, two fp32 computations differ by chance
    fp32_roundings = allowed_difference(torch.float32, v, OP_STEPS)
    # no worse than SDPA in the same dtype
    assert (got.float() - exact).abs().max() <= max(float(sdpa_error), fp32_roundings)


def test_v6_is_v2_except_for_16_bit_decodes_on_a_cpu():
    mixed = [(20, 1), (0, 23), (31, 12), (64, 1)]
    fp32 = random_step(mixed, 9, 3, 64)
    assert torch.equal(LOOP_FP32_DECODES(*fp32.arguments()), LOOP(*fp32.arguments()))
    bf16 = random_step(mixed, 9, 3, 64, dtype=torch.bfloat16)
    v2, v6 = LOOP(*bf16.arguments()), LOOP_FP32_DECODES(*bf16.arguments())
    prompt_rows = slice(1, 1 + 23 + 12)  # the fresh prompt and the chunk: the same SDPA calls
    assert torch.equal(v6[:, prompt_rows], v2[:, prompt_rows]) and not torch.equal(v6[:, :1], v2[:, :1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "requests", [[(1024, 32)], [(40, 9), (17, 1), (0, 23)]], ids=["a prefix-cache hit", "chunk + decode + fresh prompt"]
)
def test_consecutive_slots_are_read_in_place_and_give_the_gathered_result(monkeypatch, requests, dtype):
    """A fresh engine's pool hands out blocks in order, so a request's context is one run of slots:
    v2, v3 and v6 then read it from the cache in place, bit for bit what the gather gives."""
    from prefillviz.engine import paged_attention

    in_order = random_step(requests, 9, 3, 64, dtype=dtype, shuffle_blocks=False)
    shuffled = random_step(requests, 9, 3, 64, dtype=dtype)
    cached = [r for r, n in enumerate(in_order.step.num_computed) if n]
    assert all(paged_attention.consecutive_from(in_order.step, r) == int(in_order.step.slots(r)[0]) for r in cached)
    def consecutive(slots):
        return bool((slots.diff() == 1).all())

    assert all(
        (paged_attention.consecutive_from(shuffled.step, r) is None) != consecutive(shuffled.step.slots(r))
        for r in cached
    )
    # the shuffled pool broke a run
    assert any(paged_attention.consecutive_from(shuffled.step, r) is None for r in cached)
    in_place = {kernel.name: kernel(*in_order.arguments()) for kernel in (LOOP, PACKED, LOOP_FP32_DECODES)}
    monkeypatch.setattr(paged_attention, "consecutive_from", lambda step, r: None)  # every context gathered
    for kernel in (LOOP, PACKED, LOOP_FP32_DECODES):
        assert torch.equal(in_place[kernel.name], kernel(*in_order.arguments())), kernel.name


def test_a_kernel_that_forgets_the_cache_is_refused_before_it_is_timed():
    def new_tokens_only(q, k_new, v_new, key_cache, value_cache, step, scale):
        return F.scaled_dot_product_attention(
            q[None], k_new[None], v_new[None], is_causal=True, scale=scale, enable_gqa=True
        )[0]

    wrong = PagedKernel("wrong", 0, "ignores what was cached", new_tokens_only)
    inputs = random_step([(30, 5)], 4, 2, 16)
    with pytest.raises(KernelCheckError, match="differs from the naive oracle"):
        check_paged_and_time(wrong, inputs)


def test_check_and_time_reports_the_step():
    inputs = random_step([(30, 5), (0, 7)], 4, 2, 16, workload="mixed")
    result = check_paged_and_time(LOOP, inputs, runs=2, warmup=1)
    assert (result.kernel, result.num_tokens, result.context_tokens, result.workload) == ("v2 loop", 12, 42, "mixed")
    assert result.timing.median_s > 0 and result.max_abs_diff <= allowed_for(inputs)
    assert result.peak_memory_bytes is None or result.peak_memory_bytes >= result.output_bytes


def test_registry_and_the_engines_kernel():
    assert [k.version for k in PAGED_KERNELS] == [1, 2, 3, 4, 5, 6, 7, 7, 8]  # v7 in its two layouts
    assert get_paged_kernel("v3 packed") is PACKED
    with pytest.raises(KeyError, match="v1 naive"):
        get_paged_kernel("v9")
    # every candidate the dispatch times is a checked version
    assert all(get_paged_kernel(name) for name in ATTENTION_CANDIDATES)
    assert NAIVE.status("cpu")[0] and LOOP.status("cpu")[0]


def test_triton_kernel_reports_why_it_cannot_run_on_a_plain_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    runs, reason = TRITON.status("cpu")
    assert isinstance(runs, bool) and reason
    if not runs:
        assert "triton" in reason.lower() or "cuda" in reason.lower()


def test_flexattention_probe_says_whether_it_runs_and_if_so_it_is_right():
    runs, reason = flex_status("cpu")
    assert reason.startswith("compiled FlexAttention")
    if not runs:
        pytest.skip(reason)
    inputs = random_step([(20, 1), (0, 23), (31, 12)], 9, 3, 64, seed=4)
    difference, _ = check_paged(FLEX, inputs)
    assert difference <= allowed_for(inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("candidate", ATTENTION_CANDIDATES)
def test_the_last_layers_attention_at_the_kept_rows_is_the_whole_steps_there(candidate, dtype, request):
    """The forward's last layer computes attention at the rows whose logits are kept (each its request's last
    row): a decode, a fresh prompt and a decode sample, a chunk that does not is left out. Against the whole
    step's attention at those rows; a kept row inside a request (none the runner keeps) gets the whole step's."""
    from types import SimpleNamespace

    from prefillviz.backends.attention import last_rows_step, step_attention
    from prefillviz.backends.dispatch import ROWS_CANDIDATES, V8
    from prefillviz.engine.attention import AttentionMetadata

    if candidate in ROWS_CANDIDATES:
        request.getfixturevalue("compiled_ops")
    if candidate == V8:
        brgemm_runs(dtype)
    inputs = random_step([(20, 1), (0, 23), (31, 12), (64, 1)], 9, 3, 64, block_size=16, dtype=dtype, seed=5)
    step = inputs.step
    meta = AttentionMetadata(SimpleNamespace(key_cache=[inputs.key_cache], value_cache=[inputs.value_cache]),
                             step.slot_mapping, step.query_start_loc, step.num_computed, step.context_slots, [],
                             torch.zeros(0))
    q, k, v = (t.transpose(0, 1) for t in (inputs.q, inputs.k_new, inputs.v_new))  # (T, heads, D)
    rows = torch.cat([t.reshape(t.shape[0], -1) for t in (q, k, v)], dim=1)  # the q|k|v rows v7 and v8 read q from

    def attention(keep=None):
        return step_attention(
            candidate, 0, q, k, v, inputs.scale, meta, rows if candidate in ROWS_CANDIDATES else None, keep
        )

    whole = attention()
    keep = torch.tensor([0, 23, 36])  # the last rows of requests 0, 1 and 3
    assert last_rows_step(meta, keep.tolist()).query_start_loc == [0, 1, 2, 3]
    assert_within(attention(keep), whole[keep], allowed_for(inputs))
    inside = torch.tensor([5, 36])
    assert last_rows_step(meta, inside.tolist()) is None
    assert torch.equal(attention(inside), whole[inside])
