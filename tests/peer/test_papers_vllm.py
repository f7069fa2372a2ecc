"""The "Reproduce the papers" experiments on real vLLM: its prefix cache is block-granular too (a
shared prefix one token short of a block gets 0 cached tokens, one block gets the block), at its
block size 32, as on our engine; and its TTFT sweep and step timings come back for the page."""

import pytest

from prefillviz.experiments.papers_prefix_blocks import run_block_hits
from prefillviz.peers import papers_vllm

pytestmark = pytest.mark.usefixtures("needs_vllm")


def test_a_prefix_one_token_short_of_a_block_gets_no_hit_on_vllm_as_on_ours(bundled, vllm_worker):
    lengths = [31, 32, 63]
    theirs = papers_vllm.vllm_block_hits(vllm_worker, bundled.tokenizer, bundled.info.vocab_size, lengths)
    ours = run_block_hits(bundled, [32], lengths)
    assert [theirs.cached(32, n) for n in lengths] == [0, 32, 32]
    assert [p.cached_tokens for p in theirs.points] == [p.cached_tokens for p in ours.points]


def test_the_piggyback_steps_and_the_knee_sweep_run_on_vllm(bundled, vllm_worker):
    result = papers_vllm.vllm_piggyback(vllm_worker, bundled.tokenizer, bundled.info.vocab_size, chunk_tokens=64, runs=1)
    assert result.mixed_per_token_ms < result.decode_only_per_token_ms  # the step make-ups were found in vLLM's schedule
    knee = papers_vllm.vllm_knee(vllm_worker, bundled.tokenizer, bundled.info.vocab_size, [4, 8, 16], runs=1)
    assert knee.sizes == [4, 8, 16] and all(t > 0 for t in knee.ttft_ms) and knee.model_id.startswith("vLLM")
