"""FLOPs and bytes of every op of a decoder step, from the model's config alone.

One engine step runs ``num_new_tokens`` tokens (N) whose keys/values join a context of
``context_len`` tokens (C, counting the new ones):

    parallel prefill of N tokens:   N new, context N
    decode step at context C:       1 new, context C
    chunk of N after K cached:      N new, context K + N

Counting conventions (Kaplan et al. 2020, "Scaling Laws", Table 1; the roofline model of
Williams et al. 2009):

* A linear layer ``(N, in) @ (in, out)`` costs ``2 * N * in * out`` FLOPs (one multiply and
  one add per weight per token); a bias adds ``N * out``. Summed over a layer's linear ops
  this is exactly ``2 * matrix parameters * N`` (+ ``bias parameters * N``).
* Attention is counted over the (query, key) pairs actually needed. Query i of the step
  (position C - N + i) sees C - N + i + 1 keys, so

      pairs = N * (C - N) + N * (N + 1) / 2     (causal prefill of N: N(N+1)/2; decode: C)

  and QK^T and PV each cost ``2 * heads * head_dim * pairs``. ``flops_non_causal`` holds
  the full ``N * C`` pairs, which is what a dense masked kernel (SDPA's math path) really
  multiplies before the mask throws half of it away.
* Softmax, scaling, RoPE, SiLU/GELU and residual adds are not counted (a few FLOPs per
  score or element, under 1% of a step). Norms are: ~4 FLOPs per element for RMSNorm
  (square, sum, scale, weight), ~7 for LayerNorm (mean, subtract, square, sum, scale,
  weight, bias).
* Bytes are the minimum traffic to main memory: every weight read once, every activation
  read once and written once, K/V of the whole context read once and the new tokens'
  K/V written once. Attention is assumed fused (flash-style): the (N, C) score matrix is
  never written to memory.

The shape comes from ``prefillviz.analysis.model_shape`` (Llama-like or GPT-2). GPT-2's
fused ``c_attn`` is reported as its q/k/v parts and its MLP ``c_fc``/``c_proj`` as
``mlp_fc``/``mlp_proj``.
"""

from __future__ import annotations

from typing import Any

from prefillviz.analysis.model_shape import ModelShape, model_shape
from prefillviz.analysis.op_costs import ModelCost, OpCost
from prefillviz.engine.forward import own_forward_status

_NORM_FLOPS_PER_ELEMENT = {"rmsnorm": 4, "layernorm": 7}


def causal_pairs(num_new_tokens: int, context_len: int) -> int:
    """Number of (query, key) pairs causal attention needs for one step.

    Args:
        num_new_tokens: queries in the step (N).
        context_len: keys visible to the last query, including the new tokens (C >= N).

    Returns:
        ``N * (C - N) + N * (N + 1) / 2``: N(N+1)/2 for a prefill, C for a decode step.
    """
    _check_sizes(num_new_tokens, context_len)
    return num_new_tokens * (context_len - num_new_tokens) + num_new_tokens * (num_new_tokens + 1) // 2


def _check_sizes(num_new_tokens: int, context_len: int) -> None:
    if num_new_tokens < 1 or context_len < num_new_tokens:
        raise ValueError(f"Need 1 <= num_new_tokens <= context_len, got {num_new_tokens} and {context_len}.")


def _resolve_dtype_bytes(shape: ModelShape, dtype_bytes: int | None) -> int:
    if dtype_bytes is not None:
        return dtype_bytes
    if shape.dtype_bytes is None:
        raise ValueError("dtype_bytes is needed: a bare config does not say what dtype the model runs in.")
    return shape.dtype_bytes


def _linear(name: str, n: int, in_features: int, out_features: int, bias: bool, b: int) -> OpCost:
    bias_params = out_features if bias else 0
    return OpCost(
        name=name,
        flops=2 * n * in_features * out_features + n * bias_params,
        weight_bytes=(in_features * out_features + bias_params) * b,
        activation_bytes=n * (in_features + out_features) * b,
    )


def layer_op_costs(
    info_or_config: Any,
    num_new_tokens: int,
    context_len: int,
    dtype_bytes: int | None = None,
    kept_rows: int | None = None,
) -> list[OpCost]:
    """Costs of every op of one decoder layer for one step.

    Args:
        info_or_config: a ``ModelShape``, transformers config, model or ``LoadedModel``.
        num_new_tokens: tokens run through the layer in this step (N).
        context_len: keys the last new token attends to, including the new ones (C >= N).
        dtype_bytes: bytes per element of weights, activations and K/V; None takes the
            model's (not known for a bare config).
        kept_rows: the step's last rows, the only ones whose attention, o_proj, second norm and MLP
            run (None: all N; the engine's last layer: the rows whose logits are kept). Every row's
            q, k and v are projected, and its K/V written.

    Returns:
        Ops in execution order: q/k/v/o_proj, attn_scores, attn_values, the MLP
        (mlp_gate, mlp_up, mlp_down or GPT-2's mlp_fc, mlp_proj) and norms (both of the
        layer). GPT-2's fused ``c_attn`` is reported as its q, k and v parts.
    """
    shape = model_shape(info_or_config)
    b = _resolve_dtype_bytes(shape, dtype_bytes)
    n, c = num_new_tokens, context_len
    pairs = causal_pairs(n, c)
    hidden, q_width, kv_width = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    ops = [
        _linear("q_proj", n, hidden, q_width, shape.qkv_bias, b),
        _linear("k_proj", n, hidden, kv_width, shape.qkv_bias, b),
        _linear("v_proj", n, hidden, kv_width, shape.qkv_bias, b),
    ]
    attention_flops_per_pair = 2 * q_width  # 2 * heads * head_dim
    kv_traffic = (c + n) * kv_width * b  # read the whole context, write the new tokens
    m = n if kept_rows is None else kept_rows
    if m < n:  # the last m queries only
        pairs = causal_pairs(m, c)
    for name in ("attn_scores", "attn_values"):  # QK^T, then PV: the same work
        causal, all_pairs = attention_flops_per_pair * pairs, attention_flops_per_pair * m * c
        ops.append(OpCost(name, causal, 0, m * q_width * b, kv_traffic, "attention", all_pairs))
    ops.append(_linear("o_proj", m, q_width, hidden, shape.o_bias, b))
    inter = shape.intermediate_size
    if shape.family == "gpt2":
        ops += [
            _linear("mlp_fc", m, hidden, inter, shape.mlp_bias, b),
            _linear("mlp_proj", m, inter, hidden, shape.mlp_bias, b),
        ]
    else:
        ops += [
            _linear("mlp_gate", m, hidden, inter, shape.mlp_bias, b),
            _linear("mlp_up", m, hidden, inter, shape.mlp_bias, b),
            _linear("mlp_down", m, inter, hidden, shape.mlp_bias, b),
        ]
    ops.append(_norm("norms", shape, (n, m), b))  # before and after attention
    return ops


def _norm(name: str, shape: ModelShape, rows: tuple[int, ...], b: int) -> OpCost:
    """Norms of ``rows[i]`` rows each (one norm per entry)."""
    weights_per_norm = shape.hidden_size * (2 if shape.norm == "layernorm" else 1)
    elements = sum(rows) * shape.hidden_size
    flops = _NORM_FLOPS_PER_ELEMENT[shape.norm] * elements
    return OpCost(name, flops, len(rows) * weights_per_norm * b, 2 * elements * b, kind="norm")


def model_costs(
    info_or_config: Any, num_new_tokens: int, context_len: int, dtype_bytes: int | None = None, num_logit_rows: int = 1,
    engine: bool = False,
) -> ModelCost:
    """Costs of one whole-model step: embedding, every layer, final norm, lm_head.

    Args:
        info_or_config: a ``ModelShape``, transformers config, model or ``LoadedModel``.
        num_new_tokens: tokens in the step (N).
        context_len: keys the last new token attends to, including the new ones (C >= N).
        dtype_bytes: bytes per element; None takes the model's.
        num_logit_rows: rows the lm_head computes (1: the engine keeps only the logits it samples from).
        engine: what the engine's own forward runs: only those rows attend in the last layer and go on
            (attention, o_proj, MLP, norms). False: every row, as the plain (HF) forward.

    Returns:
        The ``ModelCost``. The embedding is a gather (0 FLOPs, N rows read; GPT-2 adds its position
        embedding: N x hidden FLOPs); the lm_head reads its whole (vocab, hidden) matrix even when tied.
    """
    shape = model_shape(info_or_config)
    b = _resolve_dtype_bytes(shape, dtype_bytes)
    n, hidden = num_new_tokens, shape.hidden_size
    tables = 2 if shape.family == "gpt2" else 1  # GPT-2 also gathers and adds a position embedding
    embedding = OpCost(
        "embedding", (tables - 1) * n * hidden, tables * n * hidden * b, n * hidden * b, kind="embedding"
    )
    lm_head = _linear("lm_head", num_logit_rows, hidden, shape.vocab_size, False, b)
    pruned = engine and num_logit_rows < n
    return ModelCost(
        num_new_tokens=n,
        context_len=context_len,
        dtype_bytes=b,
        num_layers=shape.num_layers,
        layer_ops=layer_op_costs(shape, n, context_len, b),
        embedding=embedding,
        # HF norms all N rows before slicing
        final_norm=_norm("final_norm", shape, (num_logit_rows if pruned else n,), b),
        lm_head=lm_head,
        num_logit_rows=num_logit_rows,
        last_layer_ops=layer_op_costs(shape, n, context_len, b, num_logit_rows) if pruned else None,
    )


def engine_step_costs(model: Any, num_new_tokens: int, context_len: int) -> ModelCost:
    """One engine step of one request on ``model`` (an ``nn.Module``): the own forward's pruned last layer,
    or the stock's."""
    return model_costs(model, num_new_tokens, context_len, engine=own_forward_status(model)[0])
