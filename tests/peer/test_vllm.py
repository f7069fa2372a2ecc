"""Our engine against real vLLM (``make vllm``) on the same workloads, fp32, block size 32.

The bundled model runs on both: ours from the GGUF, vLLM from the safetensors copy of the same
weights (``bundled.bundled_cache_dir``). Outputs, prefix-cache hits per request and the
schedule step by step must be the same; a difference is a finding, asserted exactly.
Without ``.venv-vllm`` these tests skip locally and fail in CI (which builds it).
"""

import pytest

from prefillviz import bundled as bundled_model
from prefillviz.peers import side_by_side
from prefillviz.peers.vllm_client import PeerRequest, VLLMWorker
from prefillviz.prompts import PRESETS, bench_token_ids

NEW_TOKENS = 16


pytestmark = pytest.mark.usefixtures("needs_vllm")


@pytest.fixture(scope="module")
def vllm(bundled, needs_vllm):
    with VLLMWorker(bundled_model.bundled_cache_dir(), dtype="float32") as worker:
        yield worker


def both(bundled, vllm, requests, token_budget):
    ours = side_by_side.run_ours(bundled.model, bundled.tokenizer, requests, token_budget)
    theirs = vllm.run(requests, token_budget)
    return ours, theirs, side_by_side.compare(ours, theirs)


def prompt_ids(bundled, text):
    return bundled.tokenizer(text)["input_ids"]


def test_greedy_outputs_are_the_same_for_six_prompts_one_at_a_time(bundled, vllm):
    for index, text in enumerate(list(PRESETS.values())[:6]):
        requests = [PeerRequest(f"p{index}", prompt_ids(bundled, text), NEW_TOKENS)]
        ours, theirs, comparison = both(bundled, vllm, requests, token_budget=2048)
        assert comparison.outputs_differ == [], (text, ours.requests[f"p{index}"].output_token_ids, theirs.requests[f"p{index}"].output_token_ids)
        assert len(theirs.requests[f"p{index}"].output_token_ids) == NEW_TOKENS


def test_a_mixed_batch_has_the_same_outputs_schedule_and_cache_hits(bundled, vllm):
    requests = [PeerRequest(f"r{i}", bench_token_ids(bundled.tokenizer, n + 5 * i)[5 * i :], NEW_TOKENS) for i, n in enumerate((40, 90, 200, 33))]
    ours, theirs, comparison = both(bundled, vllm, requests, token_budget=512)
    assert comparison.outputs_differ == [], comparison.summary()
    assert comparison.cached_tokens_equal, comparison.cached_tokens
    assert comparison.schedule_equal, comparison.summary()


def test_a_shared_prefix_hits_the_same_blocks_including_a_block_boundary(bundled, vllm):
    prefix = bench_token_ids(bundled.tokenizer, 64)  # exactly 2 blocks of 32
    requests = [PeerRequest("first", prefix + [100, 200, 300], 4)]
    requests += [PeerRequest(f"q{i}", prefix + bench_token_ids(bundled.tokenizer, 10 + i)[-(3 + i) :], 4, arrival_step=6 * (i + 1)) for i in range(3)]
    requests += [PeerRequest("whole", list(prefix), 4, arrival_step=30)]  # the whole prompt is cached: one token is recomputed
    ours, theirs, comparison = both(bundled, vllm, requests, token_budget=256)
    assert comparison.cached_tokens_equal, comparison.cached_tokens
    assert comparison.cached_tokens["q0"] == (64, 64)  # both full blocks of the prefix
    assert comparison.cached_tokens["whole"] == (32, 32)  # a whole-prompt hit recomputes its last block (its last token needs logits)
    assert comparison.outputs_differ == [], comparison.summary()
    assert comparison.schedule_equal, comparison.summary()


SMALL_CACHE_BLOCKS = 10  # vLLM's count, its null block included: 9 blocks of 32 tokens hold requests


def test_evictions_in_a_small_cache_leave_the_same_hits(bundled):
    tokens = bench_token_ids(bundled.tokenizer, 800)
    a, c, d = tokens[:96], tokens[200:296], tokens[400:496]  # three 3-block prefixes; the cache holds 9 blocks
    requests = [
        PeerRequest("a1", a + [5], 2), PeerRequest("c", c + [5], 2, arrival_step=4), PeerRequest("d", d + [5], 2, arrival_step=8),
        PeerRequest("a2", a + [6], 2, arrival_step=12), PeerRequest("d2", d + [7], 2, arrival_step=16),
    ]
    with VLLMWorker(bundled_model.bundled_cache_dir(), dtype="float32", num_blocks=SMALL_CACHE_BLOCKS) as small:
        theirs = small.run(requests, 256)
    ours = side_by_side.run_ours(bundled.model, bundled.tokenizer, requests, 256, num_blocks=SMALL_CACHE_BLOCKS - 1)
    comparison = side_by_side.compare(ours, theirs)
    # a's last block was evicted to make room for d (a freed request's tail blocks go first, as in vLLM); d's three stayed
    assert comparison.cached_tokens == {"a1": (0, 0), "c": (0, 0), "d": (0, 0), "a2": (64, 64), "d2": (96, 96)}
    assert comparison.all_equal, comparison.summary()


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


def test_a_worker_that_stalls_or_dies_is_reported_and_nothing_is_left_running(bundled):
    from prefillviz.peers.vllm_client import VLLMUnavailable

    worker = VLLMWorker(bundled_model.bundled_cache_dir(), dtype="float32")
    with pytest.raises(VLLMUnavailable, match="no answer within"):  # a stall: the wait has a timeout
        worker.run([PeerRequest("long", bench_token_ids(bundled.tokenizer, 2048), 8)], 2048, timeout_s=0.05)
    assert not worker.alive  # it was stopped, not left running
    with pytest.raises(VLLMUnavailable, match="not running"):  # a dead worker says so
        worker.run([PeerRequest("a", [1, 2, 3], 1)], 64)
    worker.close()  # a second close is harmless
    with pytest.raises(VLLMUnavailable, match="could not start|exited"):
        VLLMWorker("/nonexistent/model-folder", dtype="float32")  # the worker's own error, and it is gone
