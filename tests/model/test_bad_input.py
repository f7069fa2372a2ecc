"""Bad input fails with a clear PrefillVizError and leaves the engine usable; failed requests free their blocks."""

import pytest
import torch

from prefillviz.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.request import SamplingParams
from prefillviz.errors import PrefillVizError, RequestError
from tests.conftest import assert_matches_hf

PROMPT = list(range(3, 23))


def still_serves(engine, model):
    request = engine.add_request(PROMPT)
    engine.run()
    assert_matches_hf(model, PROMPT, request.first_token_logits)
    assert engine.block_pool.num_free_blocks == engine.num_blocks


@pytest.mark.parametrize("prompt", ["", "   \n\t "])
def test_empty_prompt_is_refused_then_the_engine_still_serves(bundled, prompt):
    engine = LLMEngine(bundled.model, bundled.tokenizer, EngineConfig())
    with pytest.raises(RequestError, match="empty"):
        engine.add_request(prompt)
    with pytest.raises(RequestError, match="empty"):
        engine.add_request([])
    still_serves(engine, bundled.model)


def test_prompt_longer_than_the_context_is_refused(tiny_llama):
    engine = LLMEngine(tiny_llama, None, EngineConfig())
    with pytest.raises(RequestError, match="context of 512 tokens"):
        engine.add_request([5] * 600)
    still_serves(engine, tiny_llama)


def test_prompt_longer_than_the_kv_capacity_is_refused(tiny_llama):
    engine = LLMEngine(tiny_llama, None, EngineConfig(block_size=4, num_blocks=6))
    with pytest.raises(RequestError, match="KV cache holds 24"):
        engine.add_request([5] * 20, SamplingParams(max_new_tokens=8))
    still_serves(engine, tiny_llama)


def test_bad_sampling_settings_are_refused(tiny_llama):
    engine = LLMEngine(tiny_llama, None, EngineConfig())
    for params in [SamplingParams(max_new_tokens=0), SamplingParams(temperature=-1), SamplingParams(top_p=0)]:
        with pytest.raises(RequestError):
            engine.add_request(PROMPT, params)
    with pytest.raises(RequestError, match="Token ids"):
        engine.add_request([1, 2, 10_000])


def test_kv_budget_below_one_block_is_refused(tiny_llama):
    with pytest.raises(RequestError, match="smaller than one block"):
        LLMEngine(tiny_llama, None, EngineConfig(kv_cache_memory_bytes=100))


class FailAtLayer:
    """An attention observer that raises once: a real failure inside the model's forward."""

    def __init__(self, error):
        self.error = error

    def __call__(self, layer_idx, *args):
        if self.error is not None and layer_idx == 1:
            error, self.error = self.error, None
            raise error


@pytest.mark.parametrize(
    "error, expected",
    [
        (torch.OutOfMemoryError("CUDA out of memory"), "Out of memory"),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory"), "Out of memory"),
        (RuntimeError("kernel failed"), "kernel failed"),
    ],
)
def test_a_failed_step_frees_its_requests_blocks_and_the_engine_recovers(tiny_llama, error, expected):
    engine = LLMEngine(tiny_llama, None, EngineConfig(block_size=4))
    engine.add_request([7] * 9, SamplingParams(max_new_tokens=3), request_id="decoding")
    engine.step()
    engine.runner.observers.append(FailAtLayer(error))
    victim = engine.add_request([9] * 30, request_id="victim")
    with pytest.raises((PrefillVizError, RuntimeError), match=expected):
        engine.step()
    assert victim.status.value == engine.trace().requests["victim"].status == "finished_aborted"
    assert victim.block_table == []
    assert engine.block_pool.num_free_blocks == engine.num_blocks
    still_serves(engine, tiny_llama)
