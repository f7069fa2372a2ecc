"""The FLOP model's answers the lessons quote for SmolLM2-135M's shapes: token by token does more
work than one step, TTFT proportional to FLOPs is ~17x for 16x the tokens, attention is a small
share until N ~ 6,000, a decode step's intensity is 2 / bytes per weight, and the KV cache at the
model's context is smaller than its weights."""

import pytest

from prefillviz.analysis import flop_facts
from prefillviz.analysis.flops import model_costs
from prefillviz.analysis.memory import kv_memory_report
from prefillviz.analysis.model_shape import ModelShape

SMOLLM2 = ModelShape(
    architecture="LlamaForCausalLM", family="llama", num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
    hidden_size=576, intermediate_size=1536, vocab_size=49152, max_context=8192, dtype_bytes=4,
)


def test_token_by_token_does_a_quarter_more_flops_and_the_parallel_step_is_320_steps():
    both = flop_facts.token_by_token_flops(SMOLLM2, 400)
    assert both.extra_work == pytest.approx(1.25, abs=0.01)  # a row of logits in every one of the 400 steps
    assert both.parallel_over_mean_step == pytest.approx(320, abs=1)  # not 400
    assert both.token_by_token_flops == sum(model_costs(SMOLLM2, 1, c).total_flops for c in range(1, 401))


def test_ttft_proportional_to_flops_is_about_17x_for_16x_the_tokens():
    assert flop_facts.flop_ttft_ratio(SMOLLM2, 32, 512) == pytest.approx(17.1, abs=0.05)


def test_attention_is_8_percent_at_512_and_catches_up_near_6000_tokens():
    assert flop_facts.attention_share(SMOLLM2, 512) == pytest.approx(0.077, abs=0.001)
    crossover = flop_facts.attention_crossover_tokens(SMOLLM2)
    assert 6_000 <= crossover <= 6_200
    before, at = model_costs(SMOLLM2, crossover - 1, crossover - 1), model_costs(SMOLLM2, crossover, crossover)
    assert before.attention_flops < before.linear_flops and at.attention_flops >= at.linear_flops


def test_the_fitted_c_attention_predicts_follows_the_flop_model():
    b = 1e-3  # s per token
    c = flop_facts.predicted_quadratic_coefficient(SMOLLM2, b)
    n = 4096  # the N^2 part of the time at the FLOP model's rate: attention FLOPs ~ c N^2 / (b / per-token FLOPs)
    one = model_costs(SMOLLM2, 1, 1)
    per_token = one.total_flops - one.attention_flops - one.lm_head.flops
    attention = model_costs(SMOLLM2, n, n).attention_flops
    assert c * n * n == pytest.approx(attention * b / per_token, rel=2 / n)


@pytest.mark.parametrize("dtype_bytes, limit", [(4, 0.5), (2, 1.0), (1, 2.0)])
def test_decode_intensity_limit_is_two_over_bytes_per_weight(dtype_bytes, limit):
    assert flop_facts.decode_intensity_limit(dtype_bytes) == limit
    decode = model_costs(SMOLLM2, 1, 64, dtype_bytes)
    # the weights' bytes are nearly all a decode step moves
    assert decode.arithmetic_intensity == pytest.approx(limit, rel=0.02)


def test_the_kv_cache_at_the_models_context_is_smaller_than_its_weights():
    per_token = kv_memory_report(SMOLLM2, dtype="float32").bytes_per_token
    assert per_token * SMOLLM2.max_context / 1e6 == pytest.approx(377.5, abs=0.1)  # one request at 8,192 tokens
    weight_bytes = 134_515_008 * 4  # SmolLM2-135M's parameters (tied embedding counted once)
    tokens = flop_facts.tokens_to_match_weights(weight_bytes, per_token)
    assert SMOLLM2.max_context < tokens < 2 * SMOLLM2.max_context  # two full-context requests pass the weights


@pytest.mark.parametrize(
    "ridge, size",
    # a CPU's low ridge: 256 already; a GPU's: longer; never past the context
    [(8.0, 256), (60.0, 1024), (150.0, 8192), (1e4, 8192)],
)
def test_the_lessons_size_past_the_ridge_follows_the_measured_ridge(ridge, size):
    from prefillviz.lessons.kinds.roofline import PAST_RIDGE_MARGIN, size_past_ridge

    chosen = size_past_ridge(SMOLLM2, 256, ridge)
    assert chosen == size
    if chosen < SMOLLM2.max_context:
        assert model_costs(SMOLLM2, chosen, chosen).arithmetic_intensity >= PAST_RIDGE_MARGIN * ridge
