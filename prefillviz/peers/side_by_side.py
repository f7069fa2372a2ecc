"""One workload on our engine and on a peer, and what differs between the two runs.

``run_ours`` runs a list of ``PeerRequest`` on our engine the way the vLLM worker runs it on
vLLM: each request is added before the step it arrives at, greedy, and the run goes on until
every request is finished. ``compare`` says, request by request and step by step, whether
the outputs, the prefix-cache hits and the schedules are the same. ``run_both`` does both
for one workload (a ``LoadedModel`` of ours, a ``VLLMWorker``), timed when asked.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.request import SamplingParams
from prefillviz.engine.trace import Trace
from prefillviz.peers.vllm_client import BLOCK_SIZE, VLLMWorker
from prefillviz.peers.workload import PeerRequest, check_workload


def run_ours(
    model, tokenizer, requests: list[PeerRequest], token_budget: int, num_blocks: int | None = None, model_id: str = "",
    chunking: bool = True, prefix_caching: bool = True,
) -> Trace:
    """The workload on a fresh engine of ours at the peer's block size, as the vLLM worker runs it:
    each request is added before the step it arrives at (or the first step boundary after its
    ``arrival_s``), with its own sampling, until every request is finished."""
    check_workload(requests, token_budget, chunking)
    config = EngineConfig(
        block_size=BLOCK_SIZE, token_budget=token_budget, enable_prefix_caching=prefix_caching,
        enable_chunked_prefill=chunking, num_blocks=num_blocks,
    )
    engine = LLMEngine(model, tokenizer, config, model_id=model_id)
    pending = list(requests)
    step_index, start = 0, time.perf_counter()
    while pending or engine.has_unfinished_requests():
        for request in [r for r in pending if arrived(r, step_index, time.perf_counter() - start)]:
            pending.remove(request)
            params = SamplingParams(
                max_new_tokens=request.max_new_tokens, temperature=request.temperature, top_k=request.top_k,
                top_p=request.top_p, seed=request.seed,
            )
            engine.add_request(list(request.token_ids), params, request_id=request.request_id)
        if engine.has_unfinished_requests():
            engine.step()
            step_index += 1
        elif pending and all(r.arrival_s is not None for r in pending):  # idle until the next arrival by time
            time.sleep(max(0.0, min(r.arrival_s for r in pending) - (time.perf_counter() - start)))
        else:
            step_index += 1
    return engine.trace()


def arrived(request: PeerRequest, step_index: int, elapsed_s: float) -> bool:
    """It arrives at its step, or (``arrival_s``) at the first step boundary after that time."""
    return elapsed_s >= request.arrival_s if request.arrival_s is not None else request.arrival_step <= step_index


def schedule(trace: Trace) -> list[dict[str, int]]:
    """Per step: request id -> tokens it ran (``num_scheduled_tokens`` in vLLM's words)."""
    return [{chunk.request_id: chunk.num_tokens for chunk in step.chunks} for step in trace.steps]


@dataclass
class Comparison:
    """Where two runs of one workload agree.

    Attributes:
        outputs_equal: request ids whose output tokens are the same in both runs.
        outputs_differ: request ids whose outputs differ.
        cached_tokens: request id -> (ours, theirs) prefix-cache hits in tokens.
        schedule_equal: every step ran the same requests with the same token counts.
        first_schedule_difference: (step, ours, theirs) of the first step that differs.
    """

    outputs_equal: list[str] = field(default_factory=list)
    outputs_differ: list[str] = field(default_factory=list)
    cached_tokens: dict[str, tuple[int, int]] = field(default_factory=dict)
    schedule_equal: bool = True
    first_schedule_difference: tuple[int, dict, dict] | None = None

    @property
    def cached_tokens_equal(self) -> bool:
        return all(ours == theirs for ours, theirs in self.cached_tokens.values())

    @property
    def all_equal(self) -> bool:
        return not self.outputs_differ and self.cached_tokens_equal and self.schedule_equal

    def summary(self) -> str:
        parts = [f"outputs: {len(self.outputs_equal)} of {len(self.outputs_equal) + len(self.outputs_differ)} the same"]
        parts.append(
            "cached tokens: "
            + ("the same for every request" if self.cached_tokens_equal else f"differ ({self.cached_tokens})")
        )
        if self.schedule_equal:
            parts.append("schedule: the same, step by step")
        else:
            step, ours, theirs = self.first_schedule_difference
            parts.append(f"schedule: differs first at step {step} (ours {ours}, vLLM {theirs})")
        return "; ".join(parts)


def compare(ours: Trace, theirs: Trace) -> Comparison:
    result = Comparison()
    for request_id, record in ours.requests.items():
        other = theirs.requests[request_id]
        (
            result.outputs_equal if record.output_token_ids == other.output_token_ids else result.outputs_differ
        ).append(request_id)
        result.cached_tokens[request_id] = (record.num_cached_tokens, other.num_cached_tokens)
    ours_schedule, theirs_schedule = schedule(ours), schedule(theirs)
    for step, (a, b) in enumerate(zip(ours_schedule, theirs_schedule)):
        if a != b:
            result.schedule_equal, result.first_schedule_difference = False, (step, a, b)
            break
    else:
        if len(ours_schedule) != len(theirs_schedule):
            step = min(len(ours_schedule), len(theirs_schedule))
            longer = ours_schedule if len(ours_schedule) > step else theirs_schedule
            extra = longer[step]
            result.schedule_equal = False
            result.first_schedule_difference = (
                step, extra if longer is ours_schedule else {}, extra if longer is theirs_schedule else {}
            )
    return result


@dataclass
class PeerRun:
    """One workload on both engines: the last run of each, the diff, and (when timed) every TTFT."""

    label: str
    token_budget: int
    ours: Trace
    theirs: Trace
    comparison: Comparison
    ours_ttft_s: list[float] = field(default_factory=list)
    theirs_ttft_s: list[float] = field(default_factory=list)


def run_both(
    loaded, worker: VLLMWorker, label: str, requests: list[PeerRequest], budget: int, timed_runs: int,
    chunking: bool = True, prefix_caching: bool = True,
) -> PeerRun:
    """Both engines on one workload; with ``timed_runs``, one warm-up each, then that many alternated runs
    (without, the one run's TTFT is kept)."""
    ours_ttft, theirs_ttft = [], []
    options = {"chunking": chunking, "prefix_caching": prefix_caching}
    for run in range(1 + timed_runs if timed_runs else 1):
        ours = run_ours(loaded.model, loaded.tokenizer, requests, budget, model_id=loaded.model_id, **options)
        theirs = worker.run(requests, budget, **options)
        if run > 0 or not timed_runs:
            ours_ttft.append(ours.requests[requests[0].request_id].time_to_first_token_s)
            theirs_ttft.append(theirs.requests[requests[0].request_id].time_to_first_token_s)
    return PeerRun(label, budget, ours, theirs, compare(ours, theirs), ours_ttft, theirs_ttft)
