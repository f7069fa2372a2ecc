"""What the FLOP model (``analysis.flops``) says about the lessons' questions, for any model shape.

The lessons and pages quote these instead of rules of thumb, so every figure follows the loaded
model's shapes and the run's dtype:

    token_by_token_flops        N one-token steps vs one N-token step (each step computes one
                                row of logits, so N steps do more work than one)
    flop_ttft_ratio             long / short TTFT if time were exactly proportional to FLOPs
    attention_share             attention's share of a layer's FLOPs at a prefill of N
    attention_crossover_tokens  the N where attention's O(N^2 d) catches up with the O(N d^2)
                                projections and MLP
    predicted_quadratic_coefficient   the c of t = a + bN + cN^2 that attention's FLOPs explain
    decode_intensity_limit      FLOPs per weight byte of a one-token step: 2 / bytes per weight
    tokens_to_match_weights     tokens of KV cache (over all requests of a batch) that weigh as
                                much as the model's weights
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from prefillviz.analysis.flops import model_costs
from prefillviz.analysis.model_shape import model_shape


@dataclass(frozen=True)
class BothWaysFlops:
    """One N-token step against N one-token steps (contexts 1..N), each computing one row of logits."""

    num_tokens: int
    parallel_flops: int
    token_by_token_flops: int

    @property
    def extra_work(self) -> float:
        """Token-by-token's FLOPs over parallel's: above 1 because every step computes logits."""
        return self.token_by_token_flops / self.parallel_flops

    @property
    def parallel_over_mean_step(self) -> float:
        """The parallel step's FLOPs over the mean one-token step's: below N for the same reason."""
        return self.parallel_flops / (self.token_by_token_flops / self.num_tokens)


def token_by_token_flops(source: Any, num_tokens: int, dtype_bytes: int = 4) -> BothWaysFlops:
    """FLOPs of a prefill of ``num_tokens`` in one step and in one-token steps."""
    shape = model_shape(source)
    one_step = model_costs(shape, num_tokens, num_tokens, dtype_bytes).total_flops
    steps = sum(model_costs(shape, 1, context, dtype_bytes).total_flops for context in range(1, num_tokens + 1))
    return BothWaysFlops(num_tokens, one_step, steps)


def flop_ttft_ratio(source: Any, short_tokens: int, long_tokens: int) -> float:
    """The long prompt's TTFT over the short one's if time were exactly proportional to FLOPs."""
    shape = model_shape(source)
    long_flops = model_costs(shape, long_tokens, long_tokens, 4).total_flops
    return long_flops / model_costs(shape, short_tokens, short_tokens, 4).total_flops


def attention_share(source: Any, num_tokens: int) -> float:
    """Attention's (QK^T and PV, causal) share of a layer's FLOPs in a prefill of ``num_tokens``."""
    cost = model_costs(model_shape(source), num_tokens, num_tokens, 4)
    return cost.attention_flops / (cost.attention_flops + cost.linear_flops + cost.norm_flops - cost.final_norm.flops)


def attention_crossover_tokens(source: Any, limit: int = 1 << 22) -> int:
    """The smallest prefill N at which attention's FLOPs reach the projections' and MLP's."""
    shape = model_shape(source)

    def caught_up(n: int) -> bool:
        cost = model_costs(shape, n, n, 4)
        return cost.attention_flops >= cost.linear_flops

    low, high = 1, 2
    while not caught_up(high):
        if high >= limit:
            return limit
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if caught_up(middle) else (middle, high)
    return high


def predicted_quadratic_coefficient(source: Any, b_s_per_token: float) -> float:
    """The c (s per token²) of t = a + bN + cN² that attention's FLOPs predict, given the fitted b.

    A prefill of N does ``k·N(N+1)/2`` attention FLOPs and ``f·N`` other FLOPs per token; if b is
    the time of the ``f`` FLOPs of one token, attention adds ``b · (k/2) / f`` per N².
    """
    shape = model_shape(source)
    one = model_costs(shape, 1, 1, 4)
    attention_per_pair = one.attention_flops  # k: one (query, key) pair, all layers
    # the lm_head runs once per step, not per token
    per_token = one.total_flops - one.attention_flops - one.lm_head.flops
    return b_s_per_token * (attention_per_pair / 2) / per_token


def decode_intensity_limit(dtype_bytes: int) -> float:
    """FLOPs per byte of weights a one-token step can reach: 2 FLOPs (multiply, add) per weight."""
    return 2 / dtype_bytes


def tokens_to_match_weights(weight_bytes: float, kv_bytes_per_token: float) -> int:
    """Tokens of KV cache (summed over a batch's requests) that take as many bytes as the weights."""
    return math.ceil(weight_bytes / kv_bytes_per_token)
