"""The two ways to prefill one prompt, and one run of either on a fresh engine.

    parallel        token_budget >= N   ->  1 step of N tokens  (one (1, N) batch)
    token-by-token  token_budget = 1    ->  N steps of 1 token  (N (1, 1) batches)

Both are the same engine and the same model; only the budget differs. The comparison
(``experiments.parallel``) and the length sweep (``experiments.length_sweep``) run both
through ``run_way``: one request generating its first token only, prefix cache off.
"""

from __future__ import annotations

from typing import Any

from prefillviz.engine.trace import Trace
from prefillviz.experiments.one_request import run_one
from prefillviz.machine.progress import StepProgress

PARALLEL = "parallel"
TOKEN_BY_TOKEN = "token-by-token"
WAYS = (PARALLEL, TOKEN_BY_TOKEN)
REQUEST_ID = "prompt"


def run_way(
    model: Any, tokenizer: Any, token_ids: list[int], token_budget: int, capture_level: str = "none",
    progress: StepProgress | None = None,
) -> Trace:
    """One request of ``token_ids`` (id ``REQUEST_ID``) generating its first token only, on a fresh engine."""
    return run_one(model, tokenizer, token_ids, token_budget, capture_level, progress, request_id=REQUEST_ID)[0]


def time_to_first_token_s(trace: Trace) -> float:
    """The request's time to first token in a ``run_way`` trace."""
    return trace.requests[REQUEST_ID].time_to_first_token_s


def warm_up_both_ways(model: Any, tokenizer: Any, token_ids: list[int]) -> None:
    """First-call costs out of the way: one parallel step of these tokens, and 2 one-token steps."""
    run_way(model, tokenizer, token_ids, token_budget=len(token_ids))
    run_way(model, tokenizer, token_ids[:2], token_budget=1)
