"""Every engine mechanism against the plain HF forward of the whole prompt.

Final-position logits must match within a few fp32 steps (``assert_matches_hf``): parallel
prefill, chunked prefill at chunk sizes 1, 7 and 64, a prefix-cache hit, and a mixed step that
packs one request's prefill chunk with two other requests' decode tokens in one forward.
"""

import pytest
import torch

from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.request import SamplingParams
from tests.conftest import assert_matches_hf
from tests.hf_oracle import hf_greedy_generate
from tests.tolerances import assert_same_greedy_generation

# every mechanism on the textbook backend and on the measured one; the bundled model's longest runs (its
# chunks of 1, its greedy generations) on the measured backend, the one the app runs it on (the textbook's
# run of the bundled model's chunks, decodes and prefix hit: tests/model/test_llama_forward.py)
BOTH_BACKENDS = pytest.mark.usefixtures("backend")


def random_prompt(length, vocab_size, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (length,), generator=generator).tolist()


def model_named(request, model_name):
    """The bare model of the ``tiny_llama`` or ``bundled`` fixture (a ``LoadedModel``'s ``.model``)."""
    fixture = request.getfixturevalue(model_name)
    return fixture.model if hasattr(fixture, "tokenizer") else fixture


def first_token_logits(model, token_ids, **config):
    engine = LLMEngine(model, tokenizer=None, config=EngineConfig(**config))
    request = engine.add_request(token_ids)
    trace = engine.run()
    return request.first_token_logits, trace


@BOTH_BACKENDS
@pytest.mark.parametrize("chunk_size", [None, 1, 7, 64])
def test_tiny_model_chunked_prefill_matches_hf(tiny_llama, chunk_size):
    prompt = random_prompt(100, 128, seed=1)
    logits, trace = first_token_logits(tiny_llama, prompt, token_budget=chunk_size or 512)
    assert trace.num_steps == (1 if chunk_size is None else -(-100 // chunk_size))
    assert_matches_hf(tiny_llama, prompt, logits)


@pytest.mark.parametrize("chunk_size", [None, 1, 7, 64])
def test_bundled_model_chunked_prefill_matches_hf(bundled, chunk_size):
    prompt = bundled.tokenizer(
        "Prefill runs the whole prompt through the model in one pass and writes the keys and values "
        "of every token into the KV cache; decode then adds one token at a time."
    )["input_ids"]
    if chunk_size == 1:
        prompt = prompt[:40]  # 30 layers x N steps: keep token-by-token short
    logits, trace = first_token_logits(bundled.model, prompt, token_budget=chunk_size or 512)
    assert trace.num_steps == (1 if chunk_size is None else -(-len(prompt) // chunk_size))
    assert_matches_hf(bundled.model, prompt, logits)


@BOTH_BACKENDS
@pytest.mark.parametrize("model_name", ["tiny_llama", "bundled"])
def test_prefix_cache_hit_matches_hf(request, model_name):
    model = model_named(request, model_name)
    vocab = model.config.vocab_size
    shared = random_prompt(48, vocab, seed=2)
    first, second = shared + random_prompt(5, vocab, seed=3), shared + random_prompt(9, vocab, seed=4)
    engine = LLMEngine(model, tokenizer=None, config=EngineConfig(block_size=16))
    engine.add_request(first, request_id="first")
    engine.run()
    second_request = engine.add_request(second, request_id="second")
    trace = engine.run()
    assert trace.requests["second"].num_cached_tokens == 48
    assert trace.steps[-1].chunks[0].start_position == 48
    assert trace.prefix_cache_hits == 48
    assert_matches_hf(model, second, second_request.first_token_logits)


@BOTH_BACKENDS
@pytest.mark.parametrize("model_name", ["tiny_llama", "bundled"])
def test_mixed_step_prefill_chunk_with_two_decodes_matches_hf(request, model_name):
    model = model_named(request, model_name)
    vocab = model.config.vocab_size
    short_a, short_b, long_prompt = (random_prompt(n, vocab, seed=s) for n, s in [(9, 5), (13, 6), (60, 7)])
    engine = LLMEngine(model, tokenizer=None, config=EngineConfig(token_budget=24, enable_prefix_caching=False))
    engine.add_request(short_a, SamplingParams(max_new_tokens=6), request_id="a")
    engine.add_request(short_b, SamplingParams(max_new_tokens=6), request_id="b")
    engine.step()
    long_request = engine.add_request(long_prompt, request_id="long")
    trace = engine.run()
    mixed = trace.steps[1]
    assert [(c.request_id, c.num_tokens, c.is_prefill) for c in mixed.chunks] == [
        ("a", 1, False),
        ("b", 1, False),
        ("long", 22, True),
    ]
    assert_matches_hf(model, long_prompt, long_request.first_token_logits)
    for request_id, prompt in [("a", short_a), ("b", short_b)]:
        assert_same_greedy_generation(
            model, prompt, trace.requests[request_id].output_token_ids, hf_greedy_generate(model, prompt, 6)
        )


BUNDLED_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived",
]


def engine_greedy(model, prompts, max_new_tokens, **config):
    engine = LLMEngine(model, tokenizer=None, config=EngineConfig(**config))
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, SamplingParams(max_new_tokens=max_new_tokens), request_id=str(i))
    trace = engine.run()
    return [trace.requests[str(i)].output_token_ids for i in range(len(prompts))]


def test_bundled_greedy_generations_equal_hf_generate_and_generate_batch(bundled):
    prompts = [bundled.tokenizer(text)["input_ids"] for text in BUNDLED_PROMPTS]
    ours = engine_greedy(bundled.model, prompts, 16, token_budget=32)  # chunked and batched together
    for prompt, generated in zip(prompts, ours):
        assert_same_greedy_generation(bundled.model, prompt, generated, hf_greedy_generate(bundled.model, prompt, 16))
    from transformers import ContinuousBatchingConfig, GenerationConfig

    config = GenerationConfig(max_new_tokens=16, do_sample=False, eos_token_id=-1, pad_token_id=0)
    # unsized, it sizes a cache from the free memory: ~20 s
    cache = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=64)
    outputs = bundled.model.generate_batch(
        inputs=prompts, generation_config=config, continuous_batching_config=cache, progress_bar=False
    )
    by_prompt = {tuple(output.prompt_ids): list(output.generated_tokens) for output in outputs.values()}
    for prompt, generated in zip(prompts, ours):
        assert_same_greedy_generation(bundled.model, prompt, generated, by_prompt[tuple(prompt)][:16])


@BOTH_BACKENDS
def test_tiny_greedy_generations_equal_hf_generate(tiny_llama):
    prompts = [random_prompt(n, 128, seed=10 + n) for n in (5, 17, 33)]
    ours = engine_greedy(tiny_llama, prompts, 16, token_budget=20, block_size=4)
    for prompt, generated in zip(prompts, ours):
        assert_same_greedy_generation(tiny_llama, prompt, generated, hf_greedy_generate(tiny_llama, prompt, 16))
