"""The engine serves the families the model picker offers (Llama, Qwen2, Mistral, GPT-2, Phi-3):
a tiny random model of each, chunked prefill and a decode, against the plain HF forward. The measured
backend runs them all (GPT-2 and Phi-3 on its stock forward); the textbook the Llama-shaped ones, and
refuses the others with why."""

import pytest
import torch
import transformers

from prefillviz.backends.measured import MEASURED
from prefillviz.engine.backend import TorchBackend
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.errors import ConfigError
from prefillviz.engine.forward import own_forward_status
from prefillviz.engine.request import SamplingParams
from tests.conftest import assert_matches_hf
from tests.hf_oracle import hf_greedy_generate
from tests.tolerances import assert_same_greedy_generation

COMMON = dict(vocab_size=96, initializer_range=0.2)
FAMILIES = {
    "llama": (
        "LlamaConfig", "LlamaForCausalLM",
        dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    ),
    "qwen2": (
        "Qwen2Config", "Qwen2ForCausalLM",
        dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    ),
    "mistral": (
        "MistralConfig", "MistralForCausalLM",
        dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1),
    ),
    "phi3": (
        "Phi3Config", "Phi3ForCausalLM",
        dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
             pad_token_id=0),
    ),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=32, n_layer=2, n_head=4, n_positions=256)),
}


@pytest.mark.parametrize("backend", [MEASURED, TorchBackend()], ids=["measured", "textbook"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_chunked_prefill_and_decode_match_hf(family, backend):
    config_name, model_name, sizes = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**COMMON, **sizes)
    config._attn_implementation = "sdpa"
    model = getattr(transformers, model_name)(config).eval()
    prompt = torch.randint(3, 96, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    if backend.name == "torch" and not own_forward_status(model)[0]:
        with pytest.raises(
            ConfigError,
            match="runs the engine's own forward only, which does not run this model.*pick the measured backend",
        ):
            LLMEngine(model, tokenizer=None, config=EngineConfig(), backend=backend)
        return
    engine = LLMEngine(model, tokenizer=None, config=EngineConfig(token_budget=10, block_size=8), backend=backend)
    request = engine.add_request(prompt, SamplingParams(max_new_tokens=5))
    trace = engine.run()
    assert trace.num_steps == 4 + 4  # 37 tokens in chunks of 10, then 4 decodes
    assert_matches_hf(model, prompt, request.first_token_logits)
    assert_same_greedy_generation(
        model, prompt, trace.requests[request.request_id].output_token_ids, hf_greedy_generate(model, prompt, 5)
    )


def test_seeded_sampling_through_the_engine_is_reproducible(tiny_llama):
    prompt = list(range(5, 25))

    def generate(seed):
        engine = LLMEngine(tiny_llama, None, EngineConfig(token_budget=8))
        request = engine.add_request(prompt, SamplingParams(max_new_tokens=12, temperature=1.5, top_p=0.95, seed=seed))
        return engine.run().requests[request.request_id].output_token_ids

    assert generate(1) == generate(1)
    assert generate(1) != generate(2)
