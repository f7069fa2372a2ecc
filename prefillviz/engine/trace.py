"""What a run leaves behind: plain dataclasses the UI, the CLI and the tests read.

A ``Trace`` is one ``StepRecord`` per engine step plus one ``RequestRecord`` per request. Nothing in
it points at a live module: arrays are numpy (``trace_io`` saves JSON plus an NPZ). What an instrument
adds (``instrument/records.py``) hangs on the fields it fills. Times are seconds since the first step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefillviz.engine.request import Request
from prefillviz.engine.scheduler import ScheduledChunk


@dataclass
class StepRecord:
    step_index: int
    chunks: list[ScheduledChunk]  # batch order; each is a prefill chunk or a decode token
    blocks_hit: dict[str, list[int]]
    blocks_allocated: dict[str, list[int]]
    blocks_evicted: list[int]
    preempted_request_ids: list[str]
    sampled_token_ids: dict[str, int]
    num_free_blocks: int  # after the step
    start_time_s: float  # since the engine's first step
    wall_time_s: float  # schedule + prepare + forward + sample + update (device synchronized)
    schedule_time_s: float
    prepare_time_s: float
    forward_time_s: float
    sample_time_s: float
    update_time_s: float
    capture_level: str = "none"
    layer_times: Any = None  # instrument.records.LayerTimes: timing, inspect, profile
    kv_writes: Any = None  # instrument.records.KVWriteRecord: inspect
    hidden_norms: np.ndarray | None = None  # inspect: (L + 1, T) norm after embedding and each layer
    ran: dict | None = None  # what the backend ran for this step: {"backend", "attention", "linears", ...}

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks if chunk.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return self.num_scheduled_tokens - self.num_prefill_tokens


@dataclass
class RequestRecord:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    status: str
    num_cached_tokens: int
    num_preemptions: int
    arrival_time_s: float  # since the engine's first step (negative: added before it)
    tokenize_time_s: float
    time_to_first_token_s: float | None  # arrival (after tokenizing) to first token sampled
    inter_token_times_s: list[float]
    first_token_top_ids: list[int] = field(default_factory=list)
    first_token_top_probs: list[float] = field(default_factory=list)
    first_token_entropy_nats: float | None = None
    first_token_text: str | None = None
    detokenize_time_s: float = 0.0
    first_token_logits: np.ndarray | None = None  # (V,) fp32, to re-sample without the model
    ttft_breakdown_s: dict[str, float] = field(default_factory=dict)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class Trace:
    model_id: str
    device: str
    dtype: str
    engine_config: dict
    num_blocks: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    steps: list[StepRecord] = field(default_factory=list)
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    prefix_cache_queries: int = 0  # tokens looked up (vLLM's counter names)
    prefix_cache_hits: int = 0  # tokens found
    capture_level: str = "none"  # of the last run; each step records its own
    captured_qk: dict[str, Any] = field(default_factory=dict)  # instrument.records.CapturedQK per request: inspect
    profile: Any = None  # instrument.records.ProfileRecord: profile

    @property
    def num_steps(self) -> int:
        return len(self.steps)


def since(start_time: float | None, t: float) -> float:
    """``t`` in seconds since ``start_time`` (0 before the first step has started)."""
    return t - start_time if start_time is not None else 0.0


def ttft_breakdown(request: Request, steps: list[StepRecord], start_time: float | None) -> dict[str, float]:
    """Where the time to the first token went: tokenize, then every step from arrival to it."""
    if request.first_token_time is None:
        return {}
    parts = {"tokenize_s": request.tokenize_time_s, "schedule_s": 0.0, "forward_s": 0.0, "sample_s": 0.0}
    arrival, first = since(start_time, request.arrival_time), since(start_time, request.first_token_time)
    for step in steps:
        if step.start_time_s + 1e-9 >= arrival and step.start_time_s <= first:
            parts["schedule_s"] += step.schedule_time_s + step.prepare_time_s
            parts["forward_s"] += step.forward_time_s
            parts["sample_s"] += step.sample_time_s
    parts["detokenize_s"] = request.detokenize_time_s
    engine_ttft = request.time_to_first_token_s
    parts["other_s"] = max(0.0, engine_ttft - parts["schedule_s"] - parts["forward_s"] - parts["sample_s"])
    parts["total_s"] = parts["tokenize_s"] + engine_ttft + parts["detokenize_s"]
    return parts


def request_record(request: Request, steps: list[StepRecord], start_time: float | None) -> RequestRecord:
    """The request as the trace shows it (``steps``: the engine's steps so far)."""
    first, logits = request.first_token_sample, request.first_token_logits
    return RequestRecord(
        request_id=request.request_id,
        prompt_token_ids=list(request.prompt_token_ids),
        output_token_ids=list(request.output_token_ids),
        status=request.status.value,
        num_cached_tokens=request.num_cached_tokens,
        num_preemptions=request.num_preemptions,
        arrival_time_s=since(start_time, request.arrival_time),
        tokenize_time_s=request.tokenize_time_s,
        time_to_first_token_s=request.time_to_first_token_s,
        inter_token_times_s=request.inter_token_times_s,
        first_token_top_ids=first.top_token_ids if first else [],
        first_token_top_probs=first.top_probs if first else [],
        first_token_entropy_nats=first.entropy_nats if first else None,
        first_token_text=request.first_token_text,
        detokenize_time_s=request.detokenize_time_s,
        first_token_logits=logits.numpy() if logits is not None else None,
        ttft_breakdown_s=ttft_breakdown(request, steps, start_time),
    )
