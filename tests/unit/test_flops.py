"""FLOP and byte formulas of analysis/flops.py, checked by hand and against parameter counts."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from prefillviz.analysis.flops import causal_pairs, engine_step_costs, layer_op_costs, model_costs
from prefillviz.analysis.model_shape import model_shape

TINY = LlamaConfig(
    vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1
)  # head_dim 4
SMOLLM2_SHAPE = LlamaConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3
)


def test_tiny_llama_layer_ops_match_hand_counts():
    ops = {op.name: op for op in layer_op_costs(TINY, num_new_tokens=3, context_len=3, dtype_bytes=2)}

    assert list(ops) == ["q_proj", "k_proj", "v_proj", "attn_scores", "attn_values", "o_proj", "mlp_gate", "mlp_up",
                         "mlp_down", "norms"]
    assert ops["q_proj"].flops == 2 * 3 * 8 * 8  # 2 * N * in * out
    assert ops["k_proj"].flops == ops["v_proj"].flops == 2 * 3 * 8 * 4  # 1 KV head of 4
    assert ops["o_proj"].flops == 2 * 3 * 8 * 8
    assert ops["mlp_gate"].flops == ops["mlp_up"].flops == ops["mlp_down"].flops == 2 * 3 * 8 * 16
    assert ops["attn_scores"].flops == ops["attn_values"].flops == 2 * 2 * 4 * 6  # 2 * heads * head_dim * 3*4/2 pairs
    assert ops["attn_scores"].flops_non_causal == 2 * 2 * 4 * 9  # all 3 x 3 pairs
    assert ops["norms"].flops == 2 * 4 * 3 * 8  # two RMSNorms, 4 FLOPs per element
    # bytes: weights once, activations in + out, K/V context read + new tokens written
    assert ops["q_proj"].weight_bytes == 8 * 8 * 2
    assert ops["q_proj"].activation_bytes == 3 * (8 + 8) * 2
    assert ops["attn_scores"].kv_bytes == (3 + 3) * 4 * 2
    assert ops["attn_scores"].weight_bytes == 0
    assert ops["q_proj"].bytes == 128 + 96
    assert ops["q_proj"].arithmetic_intensity == pytest.approx(384 / 224)


@pytest.mark.parametrize("num_new, context", [(1, 1), (5, 5), (64, 64), (1, 100), (4, 10), (7, 7)])
def test_causal_pairs_count_every_visible_key(num_new, context):
    brute_force = sum(context - num_new + i + 1 for i in range(num_new))  # query i sees keys 0..C-N+i
    assert causal_pairs(num_new, context) == brute_force


def test_causal_pairs_prefill_and_decode():
    assert causal_pairs(64, 64) == 64 * 65 // 2
    assert causal_pairs(1, 1024) == 1024
    with pytest.raises(ValueError):
        causal_pairs(5, 4)  # more new tokens than context
    with pytest.raises(ValueError):
        causal_pairs(0, 4)


def test_decode_is_far_less_intense_than_prefill():
    decode = model_costs(SMOLLM2_SHAPE, num_new_tokens=1, context_len=1024, dtype_bytes=2)
    prefill = model_costs(SMOLLM2_SHAPE, num_new_tokens=1024, context_len=1024, dtype_bytes=2)
    assert decode.arithmetic_intensity < 2  # ~2 FLOPs per 2-byte weight
    assert prefill.arithmetic_intensity > 50 * decode.arithmetic_intensity
    decode_q = next(op for op in decode.layer_ops if op.name == "q_proj")
    assert decode_q.arithmetic_intensity == pytest.approx(1, rel=0.01)
    # for decode the causal and non-causal attention are the same work
    assert decode.attention_flops == decode.attention_flops_non_causal
    assert prefill.attention_flops_non_causal > prefill.attention_flops


def _matrix_and_bias_params(model):
    """Non-embedding parameters of the linear layers: (matrix entries, bias entries)."""
    matrices = biases = 0
    for name, parameter in model.named_parameters():
        if any(skip in name for skip in ("embed", "wte", "wpe", "lm_head", "norm", "ln_")):
            continue
        if parameter.dim() == 2:
            matrices += parameter.numel()
        else:
            biases += parameter.numel()
    return matrices, biases


def test_llama_linear_flops_are_two_per_parameter_per_token():
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY)
    matrices, biases = _matrix_and_bias_params(model)
    assert biases == 0
    for n in (1, 7, 64):
        cost = model_costs(model, n, n)  # dtype from the model (fp32)
        assert cost.linear_flops == 2 * matrices * n
        assert cost.lm_head.flops == 2 * TINY.hidden_size * TINY.vocab_size  # one row only
        assert cost.attention_flops == 2 * TINY.num_hidden_layers * 2 * 2 * 4 * causal_pairs(n, n)
        assert cost.total_flops == cost.linear_flops + cost.attention_flops + cost.norm_flops + cost.lm_head.flops


def test_the_engines_last_layer_runs_only_the_kept_row_from_its_attention_on():
    """The engine's own forward runs the last layer's attention for the row whose logits are kept only (every
    row's K/V are written first), and o_proj, the second norm, the MLP and the final norm on that row: an
    N-token prefill costs (N - 1) rows of those less than the plain forward, and N(N + 1)/2 - N pairs of attention."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(TINY)
    n, hidden, inter = 7, TINY.hidden_size, TINY.intermediate_size
    plain, engine = model_costs(model, n, n), engine_step_costs(model, n, n)
    # o_proj + gate, up, down
    assert engine.linear_flops == plain.linear_flops - 2 * (n - 1) * (hidden * hidden + 3 * hidden * inter)
    assert engine.norm_flops == plain.norm_flops - 2 * 4 * (n - 1) * hidden  # the post-attention and the final norm
    q_width = TINY.num_attention_heads * (TINY.hidden_size // TINY.num_attention_heads)
    # QK^T and PV: the last query's n pairs
    assert engine.attention_flops == plain.attention_flops - 2 * 2 * q_width * (n * (n + 1) // 2 - n)
    assert engine.lm_head.flops == plain.lm_head.flops
    assert [name for name, _ in engine.all_ops] == [name for name, _ in plain.all_ops]
    # a decode: nothing to leave out
    assert engine_step_costs(model, 1, 9).total_flops == model_costs(model, 1, 9).total_flops
    # every row's logits kept
    assert model_costs(model, n, n, num_logit_rows=n, engine=True).linear_flops == plain.linear_flops


def test_gpt2_linear_flops_count_weights_twice_and_biases_once():
    config = GPT2Config(n_layer=2, n_embd=16, n_head=4, vocab_size=64, n_positions=64)
    model = GPT2LMHeadModel(config)
    matrices, biases = _matrix_and_bias_params(model)
    n = 5
    cost = model_costs(model, n, n)
    assert [op.name for op in cost.layer_ops][-3:] == ["mlp_fc", "mlp_proj", "norms"]
    assert cost.linear_flops == 2 * matrices * n + biases * n
    assert cost.norm_flops == (2 * 2 + 1) * 7 * n * 16  # LayerNorm ~7 FLOPs per element
    assert cost.total_flops == (
        cost.linear_flops + cost.attention_flops + cost.norm_flops + cost.lm_head.flops + cost.embedding.flops
    )


def test_shape_from_model_matches_config():
    model = LlamaForCausalLM(TINY)
    from_model, from_config = model_shape(model), model_shape(TINY)
    assert from_model.num_kv_heads == from_config.num_kv_heads == 1
    assert from_model.head_dim == from_config.head_dim == 4
    assert (from_model.architecture == "LlamaForCausalLM" and from_model.dtype_bytes == 4
            and from_config.dtype_bytes is None)
    assert from_model.num_parameters == sum(p.numel() for p in model.parameters())
    assert model_costs(model_shape(model), 9, 9).total_flops == model_costs(TINY, 9, 9, dtype_bytes=4).total_flops


def test_bare_config_needs_a_dtype():
    with pytest.raises(ValueError, match="dtype_bytes"):
        model_costs(TINY, 4, 4)
