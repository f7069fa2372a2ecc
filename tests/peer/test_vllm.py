"""Our engine against real vLLM (``make vllm``) on the same workloads, fp32, block size 32.

The bundled model runs on both: ours from the GGUF, vLLM from the safetensors copy of the same
weights (``bundled.bundled_cache_dir``). Outputs, prefix-cache hits per request and the
schedule step by step must be the same; a difference is a finding, asserted exactly.
Without ``.venv-vllm`` these tests skip locally and fail in CI (which builds it).
"""

import pytest

from prefillviz.engine.errors import ConfigError
from prefillviz.experiments.prefix import request_blocks
from prefillviz.loading import bundled as bundled_model
from prefillviz.loading.prompts import PRESETS, bench_token_ids
from prefillviz.measure.versus_vllm import vllm_side_by_side
from prefillviz.peers import side_by_side
from prefillviz.peers.vllm_client import VLLMWorker
from prefillviz.peers.workload import PeerRequest

NEW_TOKENS = 16


pytestmark = pytest.mark.usefixtures("needs_vllm")


@pytest.fixture(scope="module")
def vllm(vllm_worker):
    """The session's fp32 worker (the app's own: tests/peer/test_vllm_pages.py's pages run on it next)."""
    assert vllm_worker.alive
    return vllm_worker


SMALL_CACHE_BLOCKS = 10  # vLLM's count, its null block included: 9 blocks of 32 tokens hold requests


@pytest.fixture(scope="module")
def small_cache_vllm(bundled, needs_vllm):
    """A worker whose KV cache holds 9 blocks; the module's last test stalls it, and it is stopped."""
    with VLLMWorker(bundled_model.bundled_cache_dir(), dtype="float32", num_blocks=SMALL_CACHE_BLOCKS) as worker:
        yield worker


def both(bundled, vllm, requests, token_budget, **options):
    ours = side_by_side.run_ours(bundled.model, bundled.tokenizer, requests, token_budget, **options)
    theirs = vllm.run(requests, token_budget, **options)
    return ours, theirs, side_by_side.compare(ours, theirs)


def blocks_in_use(trace, pool_blocks):
    return [pool_blocks - step.num_free_blocks for step in trace.steps]


def assert_same_block_maps(ours, theirs):
    """Each request's prompt blocks: as many, each hit / computed / partial alike; the blocks in use and
    the evictions, step by step, alike. (Physical ids differ: vLLM's block 0 is its null block, and its
    free queue's order carries over from earlier workloads on the same worker.)"""
    for request_id in ours.requests:
        a, b = request_blocks(ours, request_id), request_blocks(theirs, request_id)
        assert a.statuses == b.statuses and len(a.physical_blocks) == len(b.physical_blocks), (request_id, a, b)
        # distinct, never the null block
        assert len(set(b.physical_blocks)) == len(b.physical_blocks) and 0 not in b.physical_blocks
    assert blocks_in_use(ours, ours.num_blocks) == blocks_in_use(theirs, theirs.num_blocks - 1)
    assert [len(s.blocks_evicted) for s in ours.steps] == [len(s.blocks_evicted) for s in theirs.steps]


def prompt_ids(bundled, text):
    return bundled.tokenizer(text)["input_ids"]


def test_greedy_outputs_are_the_same_for_six_prompts_one_at_a_time(bundled, vllm):
    for index, text in enumerate(list(PRESETS.values())[:6]):
        requests = [PeerRequest(f"p{index}", prompt_ids(bundled, text), NEW_TOKENS)]
        ours, theirs, comparison = both(bundled, vllm, requests, token_budget=2048)
        assert comparison.outputs_differ == [], (text, ours.requests[f"p{index}"].output_token_ids,
                                                 theirs.requests[f"p{index}"].output_token_ids)
        assert len(theirs.requests[f"p{index}"].output_token_ids) == NEW_TOKENS


def test_a_mixed_batch_has_the_same_outputs_schedule_and_cache_hits(bundled, vllm):
    requests = [PeerRequest(f"r{i}", bench_token_ids(bundled.tokenizer, n + 5 * i)[5 * i :], NEW_TOKENS)
                for i, n in enumerate((40, 90, 200, 33))]
    ours, theirs, comparison = both(bundled, vllm, requests, token_budget=512)
    assert comparison.outputs_differ == [], comparison.summary()
    assert comparison.cached_tokens_equal, comparison.cached_tokens
    assert comparison.schedule_equal, comparison.summary()


def test_a_shared_prefix_hits_the_same_blocks_including_a_block_boundary(bundled, vllm):
    prefix = bench_token_ids(bundled.tokenizer, 64)  # exactly 2 blocks of 32
    requests = [PeerRequest("first", prefix + [100, 200, 300], 4)]
    requests += [PeerRequest(f"q{i}", prefix + bench_token_ids(bundled.tokenizer, 10 + i)[-(3 + i) :], 4,
                             arrival_step=6 * (i + 1)) for i in range(3)]
    # the whole prompt is cached: one token is recomputed
    requests += [PeerRequest("whole", list(prefix), 4, arrival_step=30)]
    ours, theirs, comparison = both(bundled, vllm, requests, token_budget=256)
    assert comparison.cached_tokens_equal, comparison.cached_tokens
    assert comparison.cached_tokens["q0"] == (64, 64)  # both full blocks of the prefix
    # a whole-prompt hit recomputes its last block (its last token needs logits)
    assert comparison.cached_tokens["whole"] == (32, 32)
    assert comparison.outputs_differ == [], comparison.summary()
    assert comparison.schedule_equal, comparison.summary()
    assert_same_block_maps(ours, theirs)
    assert request_blocks(theirs, "q0").statuses == ["hit", "hit", "partial"]


def test_prefix_caching_off_and_chunking_off_run_the_same_on_both(bundled, vllm):
    prefix = bench_token_ids(bundled.tokenizer, 64)
    requests = [PeerRequest("first", prefix + [100, 200], 4), PeerRequest("again", prefix + [300], 4, arrival_step=6)]
    ours, theirs, comparison = both(bundled, vllm, requests, 256, prefix_caching=False)
    assert comparison.cached_tokens == {"first": (0, 0), "again": (0, 0)}  # vLLM's skip_reading_prefix_cache
    assert comparison.all_equal, comparison.summary()
    assert theirs.engine_config["enable_prefix_caching"] is False

    short = [PeerRequest(f"short-{i}", bench_token_ids(bundled.tokenizer, 12 + i)[i:], 6) for i in range(2)]
    long = PeerRequest("long", bench_token_ids(bundled.tokenizer, 350)[50:], 3, arrival_step=2)
    ours, theirs, comparison = both(bundled, vllm, [*short, long], 512, chunking=False)
    assert comparison.outputs_differ == [] and comparison.cached_tokens_equal, comparison.summary()
    # A policy difference, asserted exactly: with chunking off our engine runs the old way, a prefill-only
    # step that stalls the decodes; vLLM V1 only refuses to split a prompt, and still runs the running
    # requests' decodes in the same step when the budget holds them (scheduler.py: running first, then a
    # waiting prompt is admitted whole or not at all).
    decode = {"short-0": 1, "short-1": 1}
    assert side_by_side.schedule(ours)[2:4] == [{"long": 300}, {**decode, "long": 1}]
    assert side_by_side.schedule(theirs)[2:4] == [{**decode, "long": 300}, {**decode, "long": 1}]
    assert len(ours.steps) == len(theirs.steps) + 1  # the decodes it stalled cost ours one more step
    with pytest.raises(ConfigError, match="must hold the longest prompt"):
        vllm.run([*short, long], 64, chunking=False)  # it would never fit a step: refused, not hung


def test_arrival_by_time_and_seeded_sampling(bundled, vllm):
    prompt = bench_token_ids(bundled.tokenizer, 200)
    requests = [PeerRequest("now", prompt, 3), PeerRequest("later", prompt[:60], 3, arrival_s=0.4)]
    ours, theirs, comparison = both(bundled, vllm, requests, 64)
    for trace in (ours, theirs):
        assert trace.requests["later"].arrival_time_s - trace.requests["now"].arrival_time_s >= 0.4
    # the schedules may part: timing decides arrivals
    assert comparison.outputs_differ == [] and comparison.cached_tokens_equal

    sampled = [PeerRequest("s", prompt, 12, temperature=0.9, top_k=40, top_p=0.95, seed=7)]
    first, second = (vllm.run(sampled, 256).requests["s"].output_token_ids for _ in range(2))
    greedy = vllm.run([PeerRequest("s", prompt, 12)], 256).requests["s"].output_token_ids
    assert first == second and first != greedy  # vLLM's seeded sampler: repeatable, and not greedy


def test_evictions_in_a_small_cache_leave_the_same_hits(bundled, small_cache_vllm):
    tokens = bench_token_ids(bundled.tokenizer, 800)
    a, c, d = tokens[:96], tokens[200:296], tokens[400:496]  # three 3-block prefixes; the cache holds 9 blocks
    requests = [
        PeerRequest("a1", a + [5], 2), PeerRequest("c", c + [5], 2, arrival_step=4),
        PeerRequest("d", d + [5], 2, arrival_step=8),
        PeerRequest("a2", a + [6], 2, arrival_step=12), PeerRequest("d2", d + [7], 2, arrival_step=16),
    ]
    theirs = small_cache_vllm.run(requests, 256)
    ours = side_by_side.run_ours(bundled.model, bundled.tokenizer, requests, 256, num_blocks=SMALL_CACHE_BLOCKS - 1)
    comparison = side_by_side.compare(ours, theirs)
    # a's last block was evicted to make room for d (a freed request's tail blocks go first, as in vLLM);
    # d's three stayed
    assert comparison.cached_tokens == {"a1": (0, 0), "c": (0, 0), "d": (0, 0), "a2": (64, 64), "d2": (96, 96)}
    assert comparison.all_equal, comparison.summary()
    assert_same_block_maps(ours, theirs)
    assert sum(len(s.blocks_evicted) for s in theirs.steps) > 0


@pytest.mark.parametrize(
    "budget, long_tokens, arrival",
    [(64, 300, 1), (128, 700, 2), (96, 250, 0)],
)
def test_chunked_workloads_schedule_the_same_tokens_every_step(bundled, vllm, budget, long_tokens, arrival):
    short = [PeerRequest(f"short-{i}", bench_token_ids(bundled.tokenizer, 12 + i)[i:], 8) for i in range(3)]
    long = PeerRequest("long", bench_token_ids(bundled.tokenizer, long_tokens + 50)[50:], 4, arrival_step=arrival)
    ours, theirs, comparison = both(bundled, vllm, [*short, long], token_budget=budget)
    assert comparison.schedule_equal, comparison.summary()
    assert comparison.outputs_differ == [], comparison.summary()


def test_the_bench_side_by_side_fills_its_keys(bundled, vllm):
    """``bench``'s vLLM part on its quick sizes, on this module's worker (tests/model runs the rest of the bench with
    --no-vllm)."""
    result = vllm_side_by_side(bundled, 24, 1, quick=True, worker=vllm)
    assert result["vllm_outputs_equal"] == result["details"]["outputs_compared"] == 8  # fp32: the same greedy tokens
    assert result["vllm_outputs_within_tolerance"] == 8 and result["details"]["parting"] == []
    assert all(result[key] > 0 for key in ("engine_over_vllm_prefill_512", "engine_over_vllm_prefill_2048",
                                           "engine_over_vllm_prefix_hit", "engine_over_vllm_decode"))
    assert result["details"]["versions"]["vllm"] and vllm.alive  # a worker it was given is left running
    seconds, by_round = result["details"]["seconds"], result["details"]["ratios_by_round"]
    # one round: its ratio
    assert len(by_round["decode"]) == 1 and result["engine_over_vllm_decode"] == by_round["decode"][0]
    assert by_round["decode"][0] == pytest.approx(seconds["decode"]["vllm"]["median"]
                                                  / seconds["decode"]["ours"]["median"])


def test_a_worker_that_stalls_or_dies_is_reported_and_nothing_is_left_running(bundled, small_cache_vllm):
    """The last test of the module: it stalls the small-cache worker, which is then stopped."""
    from prefillviz.peers.vllm_client import VLLMUnavailable

    worker = small_cache_vllm
    with pytest.raises(VLLMUnavailable, match="no answer within"):  # a stall: the wait has a timeout
        # ~0.5 s of work
        worker.run([PeerRequest("long", bench_token_ids(bundled.tokenizer, 256), 8)], 256, timeout_s=0.05)
    assert not worker.alive  # it was stopped, not left running
    with pytest.raises(VLLMUnavailable, match="not running"):  # a dead worker says so
        worker.run([PeerRequest("a", [1, 2, 3], 1)], 64)
    worker.close()  # a second close is harmless
    with pytest.raises(VLLMUnavailable, match="could not start|exited"):
        VLLMWorker("/nonexistent/model-folder", dtype="float32")  # the worker's own error, and it is gone
