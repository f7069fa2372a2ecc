"""Picks the next token from one position's logits: greedy, temperature, top-k, top-p, seed.

Also returns the distribution the token came from (top tokens and their probabilities at
temperature 1, before any cut), which the app shows as the first-token distribution.
"""

from __future__ import annotations

import torch

from prefillviz.engine.request import SampleResult, SamplingParams

NUM_TOP_TOKENS = 10


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, then top-k, then top-p (nucleus); removed tokens get -inf. (V,) fp32."""
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= params.top_p  # keep the token that crosses p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> SampleResult:
    """Sample one token from ``logits`` (V,)."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    top = torch.topk(probs, min(NUM_TOP_TOKENS, probs.numel()))
    entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum()
    if params.is_greedy:
        token_id = int(torch.argmax(logits))
    else:
        filtered = torch.softmax(filter_logits(logits, params), dim=-1)
        token_id = int(torch.multinomial(filtered, 1, generator=generator))
    return SampleResult(
        token_id=token_id,
        top_token_ids=top.indices.tolist(),
        top_probs=top.values.tolist(),
        entropy_nats=float(entropy),
    )
