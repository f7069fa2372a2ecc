"""What the trace keeps of a request: a ``Request`` becomes a plain ``RequestRecord``.

The engine makes a finished request's record once, when the scheduler lets it go, and an
unfinished one's whenever a trace is taken. Times are seconds since the engine's first step
(``start_time``).
"""

from __future__ import annotations

from prefillviz.engine.request import Request
from prefillviz.engine.trace import RequestRecord, StepRecord


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
