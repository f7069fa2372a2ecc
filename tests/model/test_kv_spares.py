"""The measured backend's KV cache memory, kept between engines (``prefillviz/backends/kv_spares.py``):
a new engine takes a dropped one's tensors, never while anything still holds them, and what they held
reaches no output."""

import pytest
import torch

from prefillviz.backends.measured import MEASURED
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from tests.conftest import assert_matches_hf
from tests.model.test_engine_oracle import random_prompt


def test_a_new_engine_reuses_a_dropped_engines_cache_memory_and_its_garbage_reaches_no_output(tiny_llama):
    """The measured backend's pool (``kv_spares.py``): the next engine of the same cache shape takes the dropped one's
    tensors (no fresh pages to fault in), and since a slot is read only after its own step wrote it, what the
    old engine left there (here NaN in every slot) changes nothing: the logits still match HF."""
    import gc

    config = {"token_budget": 512, "num_blocks": 37}  # a shape no other test's engine has
    first = LLMEngine(tiny_llama, tokenizer=None, config=EngineConfig(**config), backend=MEASURED)
    first.add_request(random_prompt(40, 128, seed=3))
    first.run()
    for t in first.kv_cache.key_cache + first.kv_cache.value_cache:
        t.fill_(float("nan"))
        t.left_by_the_first_engine = True  # the same tensor objects come back, not just memory at the same address
    del first, t  # the loop's last tensor too: a tensor still held keeps its set out of the pool
    gc.collect()
    prompt = random_prompt(70, 128, seed=4)
    engine = LLMEngine(tiny_llama, tokenizer=None, config=EngineConfig(**config), backend=MEASURED)
    request = engine.add_request(prompt)
    engine.run()
    logits = request.first_token_logits
    del engine
    assert torch.isfinite(logits).all()
    assert_matches_hf(tiny_llama, prompt, logits)
    # the second engine's went back too
    second = LLMEngine(tiny_llama, tokenizer=None, config=EngineConfig(**config), backend=MEASURED)
    assert all(
        getattr(t, "left_by_the_first_engine", False) for t in second.kv_cache.key_cache + second.kv_cache.value_cache
    )


@pytest.mark.parametrize("held", ["a view", "a layer's tensor", "the list of layers"])
def test_a_dropped_cache_still_held_is_not_handed_out(tiny_llama, held):
    """Whatever of a dropped engine's cache is still held (a figure's view of one layer's keys, the tensor
    itself, the engine's list of layers) keeps that set out of the pool: a new engine must not write under it."""
    import gc

    config = EngineConfig(token_budget=512, num_blocks=41)
    first = LLMEngine(tiny_llama, tokenizer=None, config=config, backend=MEASURED)
    kept = {
        "a view": lambda c: c.key_cache[0][:2], "a layer's tensor": lambda c: c.key_cache[0],
        "the list of layers": lambda c: c.key_cache,
    }[held](first.kv_cache)
    layer = kept[0] if held == "the list of layers" else kept
    layer.fill_(3.0)
    del first
    gc.collect()
    second = LLMEngine(tiny_llama, tokenizer=None, config=config, backend=MEASURED)
    second.add_request(random_prompt(30, 128, seed=5))
    second.run()
    assert all(t.untyped_storage().data_ptr() != layer.untyped_storage().data_ptr() for t in second.kv_cache.key_cache)
    assert bool((layer == 3.0).all())
    del kept, layer, second
    gc.collect()
    # once let go, that set is handed out again
    third = LLMEngine(tiny_llama, tokenizer=None, config=config, backend=MEASURED)
    assert len({t.untyped_storage().data_ptr() for t in third.kv_cache.key_cache}) == len(third.kv_cache.key_cache)
