"""The first-token distribution at the last prompt position, greedy and as sampled.

Works on the logits a run kept (``RequestRecord.first_token_logits``), so the app can change
temperature / top-k / top-p and re-sample without running the model again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from prefillviz.engine.request import SamplingParams
from prefillviz.engine.sampler import filter_logits


@dataclass
class TokenDistribution:
    top_token_ids: list[int]  # most likely first
    top_probs: list[float]
    entropy_nats: float
    num_candidates: int  # tokens with non-zero probability


@dataclass
class FirstTokenView:
    greedy: TokenDistribution  # softmax(logits), temperature 1, no cut
    sampling: TokenDistribution  # after temperature, top-k, top-p
    greedy_token_id: int
    sampled_token_id: int
    sampled_token_rank: int  # 1 = the most likely token under the greedy distribution


def _distribution(logits: torch.Tensor, k: int) -> TokenDistribution:
    probs = torch.softmax(logits, dim=-1)
    top = torch.topk(probs, min(k, probs.numel()))
    nonzero = probs > 0
    entropy = -(probs[nonzero] * probs[nonzero].log()).sum()
    return TokenDistribution(top.indices.tolist(), top.values.tolist(), float(entropy), int(nonzero.sum()))


def first_token_view(
    logits, params: SamplingParams, sampled_token_id: int | None = None, k: int = 10, seed: int | None = None
) -> FirstTokenView:
    """Both distributions and the rank of the sampled token.

    Args:
        logits: (V,) logits at the last prompt position (numpy or torch).
        params: the sampling settings to show (temperature 0 = greedy).
        sampled_token_id: the token the run sampled; if None, sample one here with ``seed``.
        k: how many top tokens to list.
    """
    logits = torch.as_tensor(np.asarray(logits), dtype=torch.float32)
    greedy = _distribution(logits, k)
    sampling = greedy if params.is_greedy else _distribution(filter_logits(logits, params), k)
    greedy_token_id = int(logits.argmax())
    if sampled_token_id is None:
        if params.is_greedy:
            sampled_token_id = greedy_token_id
        else:
            generator = torch.Generator().manual_seed(seed) if seed is not None else None
            probs = torch.softmax(filter_logits(logits, params), dim=-1)
            sampled_token_id = int(torch.multinomial(probs, 1, generator=generator))
    rank = int((logits > logits[sampled_token_id]).sum()) + 1
    return FirstTokenView(greedy, sampling, greedy_token_id, sampled_token_id, rank)
