"""Block-sparse prefill on the bundled model: keeping every block is dense attention, token for token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from prefillviz.backends.sparse import BlockSparseBackend
from prefillviz.engine.errors import ConfigError
from prefillviz.engine.request import SamplingParams
from prefillviz.engine.sparse_attention import block_sparse_backend
from prefillviz.experiments.long_text import long_prompt_ids, long_prompts
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.experiments.sparse_prefill import (
    BACKENDS,
    GREEDY_TOKENS,
    first_token_kl,
    greedy_agreement,
    run_prefill,
)
from tests.conftest import assert_matches_hf
from tests.tolerances import logits_allowed_difference

NUM_TOKENS = 512  # four 128-token blocks: the sparse path runs


@pytest.fixture(scope="module")
def prompt(bundled):
    return long_prompt_ids(bundled.tokenizer, NUM_TOKENS)


@pytest.fixture(scope="module")
def dense(bundled, prompt):
    return run_prefill(bundled.model, prompt, None, GREEDY_TOKENS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_keep_everything_gives_dense_first_token_and_32_greedy_tokens(bundled, prompt, dense, backend):
    """Dense on the textbook against every block kept on either backend (the measured one: v8 block-sparse where
    it was measured faster, else the textbook's)."""
    every_block = run_prefill(bundled.model, prompt, 1.0, GREEDY_TOKENS, backend_name=backend)
    assert every_block.output_token_ids[0] == dense.output_token_ids[0]
    assert greedy_agreement(dense.output_token_ids, every_block.output_token_ids) == GREEDY_TOKENS
    assert_matches_hf(bundled.model, prompt, torch.from_numpy(every_block.first_token_logits))
    # both within `allowed` of HF's logits, so |log p - log q| <= 2 x 2 allowed everywhere, which bounds the KL
    allowed = logits_allowed_difference(bundled.model, torch.from_numpy(dense.first_token_logits).float(), NUM_TOKENS)
    assert first_token_kl(dense.first_token_logits, every_block.first_token_logits) <= 4 * allowed


def test_skipping_blocks_changes_the_logits_but_not_the_decode_path(bundled, prompt, dense):
    sparse = run_prefill(bundled.model, prompt, 0.3, 2)
    assert not np.allclose(sparse.first_token_logits, dense.first_token_logits)  # blocks were really skipped
    assert first_token_kl(dense.first_token_logits, sparse.first_token_logits) > 0


def test_a_sparse_engine_says_what_its_attention_ran(bundled, prompt):
    engine = one_request_engine(bundled.model, None, NUM_TOKENS, NUM_TOKENS + 1, backend=block_sparse_backend(0.5))
    engine.add_request(prompt)
    record = engine.step()
    assert record.ran["backend"] == "torch" and "block-sparse prefill (XAttention, keep 0.5)" in record.ran["attention"]
    measured = BlockSparseBackend(0.5)
    engine = one_request_engine(bundled.model, None, NUM_TOKENS, NUM_TOKENS + 2, backend=measured)
    engine.add_request(prompt, SamplingParams(max_new_tokens=2))
    prefill, decode = engine.step(), engine.step()
    kernel = measured.choice_for(bundled.model).kernel
    assert prefill.ran["backend"] == "measured"
    assert f"{kernel} prefill (XAttention, keep 0.5" in prefill.ran["attention"]
    assert "block-sparse" not in decode.ran["attention"]  # decodes stay dense


def test_the_long_prompt_is_prose_that_does_not_repeat(bundled):
    ids = long_prompt_ids(bundled.tokenizer, 8192)
    assert len(ids) == 8192 and len(set(ids)) > 1500  # distinct ids (BENCH_TEXT repeated has ~80)
    windows = {tuple(ids[i : i + 16]) for i in range(0, 8192 - 16, 16)}
    assert len(windows) == len(range(0, 8192 - 16, 16))  # no 16-token window comes back
    assert long_prompts(bundled.tokenizer, 1000, 4)[2] == long_prompt_ids(bundled.tokenizer, 3000)[2000:]
    with pytest.raises(ConfigError, match="more than the bundled book"):
        long_prompt_ids(bundled.tokenizer, 10**6)
