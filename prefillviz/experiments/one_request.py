"""A fresh engine for one request, prefix cache off: what most experiments time.

Every run computes its whole prompt again (no earlier request's blocks to hit), and the KV
cache is sized for the request rather than for the memory budget, so building the engine
costs little. In hosted mode the engine carries the demo's request limits
(``HostedPolicy.engine_limits``). Callers that need more (several requests, the cache on)
build an ``LLMEngine`` themselves.
"""

from __future__ import annotations

from typing import Any

from prefillviz.engine.backend import Backend
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.request import SamplingParams
from prefillviz.engine.trace import Trace
from prefillviz.instrument.capture import run_captured
from prefillviz.loading.hosted import hosted_policy
from prefillviz.machine.progress import StepProgress


def one_request_engine(
    model: Any, tokenizer: Any = None, token_budget: int = 8192, num_tokens: int | None = None, model_id: str = "",
    backend: Backend | None = None, **config: Any,
) -> LLMEngine:
    """An engine for one request at a time, prefix caching off.

    Args:
        model: the model.
        tokenizer: its tokenizer (None when prompts are token ids).
        token_budget: tokens per step (the prompt's length: one step; 1: token by token).
        num_tokens: size the KV cache for one request of this many tokens, prompt and new
            tokens together (+ one block); None sizes it from the memory budget.
        model_id: recorded in the trace.
        backend: the engine's ops (None: the model's, ``engine.backend.backend_for``).
        **config: any other ``EngineConfig`` field.
    """
    if num_tokens is not None:
        config.setdefault("num_blocks", -(-num_tokens // config.get("block_size", EngineConfig.block_size)) + 1)
    config = {**hosted_policy().engine_limits(), **config}
    config = EngineConfig(token_budget=token_budget, enable_prefix_caching=False, **config)
    return LLMEngine(model, tokenizer, config, model_id=model_id, backend=backend)


class OnePrompt:
    """One prompt's prefill on an engine of its own, prefix cache off: each call computes the
    whole prompt again and returns (its trace, the request's id). The one way every part times
    one prompt's time to first token: the bench, the comparison of the two ways, the lessons.

    Args:
        model, tokenizer: the model (a tokenizer only when the prompt is text).
        prompt: text or token ids.
        token_budget: tokens per step (None: the prompt's length, one step; 1: token by token).
        capture_level: the instruments of each run (``instrument.capture``).
        max_new_tokens: 1 stops at the first token.
        request_id: the id of the request (one call only; None: the engine numbers each call's).
        model_id: recorded in the trace.
        **config: any other ``EngineConfig`` field.
    """

    def __init__(
        self, model: Any, tokenizer: Any, prompt: str | list[int], token_budget: int | None = None,
        capture_level: str = "none",
        max_new_tokens: int = 1, request_id: str | None = None, model_id: str = "", **config: Any,
    ) -> None:
        token_budget = token_budget or (len(prompt) if isinstance(prompt, list) else 8192)
        num_tokens = len(prompt) + max_new_tokens if isinstance(prompt, list) else None
        self.engine = one_request_engine(model, tokenizer, token_budget, num_tokens, model_id, **config)
        self.prompt, self.capture_level, self.max_new_tokens, self.request_id = (
            prompt, capture_level, max_new_tokens, request_id
        )

    def __call__(self, progress: StepProgress | None = None) -> tuple[Trace, str]:
        request = self.engine.add_request(
            self.prompt, SamplingParams(max_new_tokens=self.max_new_tokens), request_id=self.request_id
        )
        trace = run_captured(self.engine, capture_level=self.capture_level, progress=progress)
        return trace, request.request_id

    def ttft_s(self) -> float:
        """One run's time to first token, seconds."""
        trace, request_id = self()
        return trace.requests[request_id].time_to_first_token_s


def run_one(
    model: Any,
    tokenizer: Any,
    prompt: str | list[int],
    token_budget: int,
    capture_level: str = "none",
    progress: StepProgress | None = None,
    max_new_tokens: int = 1,
    request_id: str | None = None,
    model_id: str = "",
    **config: Any,
) -> tuple[Trace, str]:
    """One request on a fresh engine (``OnePrompt``, called once); returns (its trace, the request's id)."""
    return OnePrompt(
        model, tokenizer, prompt, token_budget, capture_level, max_new_tokens, request_id, model_id, **config
    )(progress)
