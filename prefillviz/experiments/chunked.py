"""Chunked prefill: a long prompt arrives while short requests are decoding.

The same workload runs twice on the real model, greedy, with a timing pass (capture "none"):

    chunking off   the long prompt runs whole in one prefill-only step; every decode waits
    chunking on    decodes go first, the long prompt gets the budget left over, chunk by chunk

    step:        0    1    2    3    4    5   ...
    short-1     [P]  [d]  [d]  [d]  [d]  [d]
    short-2     [P]  [d]  [d]  [d]  [d]  [d]
    long                  [P..][P..][P..][P.]   <- arrives at step 2, chunked into the budget

What users feel: the inter-token latency (ITL) of the decoding requests and the time to
first token (TTFT) of the long one. ``experiments.budget_sweep`` repeats the chunked run at
several token budgets to draw the trade-off between the two. Outputs of every run are compared
token for token with the chunking-off run: the schedule must never change what is generated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.errors import RequestError
from prefillviz.engine.request import SamplingParams
from prefillviz.engine.trace import StepRecord, Trace
from prefillviz.experiments.outputs import OutputCheck, compare_outputs
from prefillviz.experiments.warm_up import short_warm_up
from prefillviz.loading.hosted import hosted_policy
from prefillviz.loading.prompts import PRESETS
from prefillviz.machine.progress import StepProgress, offset_progress

LONG_REQUEST_ID = "long"


def short_request_id(index: int) -> str:
    return f"short-{index + 1}"


@dataclass(frozen=True)
class ChunkedWorkload:
    """k short requests that start decoding, then one long prompt arriving at ``arrival_step``.

    Attributes:
        short_prompts: the k short prompts (token ids).
        short_max_new_tokens: tokens each short request generates.
        long_prompt: the long prompt (token ids).
        long_max_new_tokens: tokens the long request generates after its prefill.
        arrival_step: engine steps run before the long prompt is added.
        token_budget: most tokens per step (vLLM's ``max_num_batched_tokens``).
        block_size: tokens per KV block.
    """

    short_prompts: tuple[tuple[int, ...], ...]
    short_max_new_tokens: int
    long_prompt: tuple[int, ...]
    long_max_new_tokens: int = 4
    arrival_step: int = 2
    token_budget: int = 64
    block_size: int = 16

    def __post_init__(self) -> None:
        # impossible values fail here (ConfigError)
        EngineConfig(block_size=self.block_size, token_budget=self.token_budget)
        if not self.long_prompt or any(not prompt for prompt in self.short_prompts):
            raise RequestError("Every prompt of the workload needs at least one token.")
        if self.arrival_step < 0:
            raise RequestError(f"The long prompt can't arrive before step 0 (got {self.arrival_step}).")

    @property
    def request_ids(self) -> list[str]:
        return [short_request_id(i) for i in range(len(self.short_prompts))] + [LONG_REQUEST_ID]

    @property
    def num_blocks(self) -> int:
        """KV blocks for every request at once: nobody is ever preempted, and no memory is wasted."""
        prompts = [(p, self.short_max_new_tokens) for p in self.short_prompts] + [
            (self.long_prompt, self.long_max_new_tokens)
        ]
        return sum(math.ceil((len(p) + n) / self.block_size) for p, n in prompts)

    def engine_config(self, enable_chunked_prefill: bool) -> EngineConfig:
        # prefix caching off: the comparison is about scheduling alone
        return EngineConfig(
            block_size=self.block_size,
            token_budget=self.token_budget,
            enable_chunked_prefill=enable_chunked_prefill,
            enable_prefix_caching=False,
            num_blocks=self.num_blocks,
            **hosted_policy().engine_limits(),  # the hosted demo's request limits (none off it)
        )

    def estimated_num_steps(self, enable_chunked_prefill: bool) -> int:
        """About how many steps a run takes (for progress bars only; the run decides)."""
        k = len(self.short_prompts)
        short_prefill_steps = math.ceil(sum(map(len, self.short_prompts)) / self.token_budget)
        short_end = short_prefill_steps + self.short_max_new_tokens - 1
        if enable_chunked_prefill:
            long_prefill_steps = math.ceil(len(self.long_prompt) / max(self.token_budget - k, 1))
            return max(short_end, self.arrival_step + long_prefill_steps + self.long_max_new_tokens - 1)
        return max(short_end + 1, self.arrival_step + self.long_max_new_tokens)


def _cycle(token_ids: list[int], start: int, num_tokens: int) -> tuple[int, ...]:
    repeats = -(-(start + num_tokens) // len(token_ids))
    return tuple((token_ids * repeats)[start : start + num_tokens])


@dataclass(frozen=True)
class WorkloadSettings:
    """The chunked workload's sizes: the one place their defaults are written (the pages'
    sliders, the lessons' parameters and the bench start from ``WORKLOAD_DEFAULTS``)."""

    num_short_requests: int = 3  # users already decoding when the long prompt arrives
    short_prompt_tokens: int = 16  # each one's prompt
    short_max_new_tokens: int = 16  # and the tokens it generates
    long_prompt_tokens: int = 512  # the long prompt
    long_max_new_tokens: int = 4
    arrival_step: int = 2  # the engine step it arrives at
    token_budget: int = 64  # tokens per step when chunking is on

    def as_dict(self) -> dict[str, int]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


WORKLOAD_DEFAULTS = WorkloadSettings()


def build_workload(
    tokenizer,
    num_short_requests: int = WORKLOAD_DEFAULTS.num_short_requests,
    short_prompt_tokens: int = WORKLOAD_DEFAULTS.short_prompt_tokens,
    short_max_new_tokens: int = WORKLOAD_DEFAULTS.short_max_new_tokens,
    long_prompt_tokens: int = WORKLOAD_DEFAULTS.long_prompt_tokens,
    long_max_new_tokens: int = WORKLOAD_DEFAULTS.long_max_new_tokens,
    arrival_step: int = WORKLOAD_DEFAULTS.arrival_step,
    token_budget: int = WORKLOAD_DEFAULTS.token_budget,
    block_size: int = 16,
) -> ChunkedWorkload:
    """A workload of real prose from the "Long document" preset, cut to the token counts asked.

    The long prompt is the document from its start (repeated if asked for more than it has);
    short request i is a slice from further in, so every prompt is different real text.

    Raises:
        ConfigError: a token budget or block size that is not a positive whole number.
        RequestError: a prompt length below 1 or an arrival step below 0.
    """
    if num_short_requests < 0 or short_prompt_tokens < 1 or long_prompt_tokens < 1:
        raise RequestError("Prompts need at least one token, and the number of short requests can't be negative.")
    document = list(tokenizer(PRESETS["Long document"])["input_ids"])
    short_prompts = tuple(_cycle(document, 300 + 47 * i, short_prompt_tokens) for i in range(num_short_requests))
    return ChunkedWorkload(
        short_prompts=short_prompts,
        short_max_new_tokens=short_max_new_tokens,
        long_prompt=_cycle(document, 0, long_prompt_tokens),
        long_max_new_tokens=long_max_new_tokens,
        arrival_step=arrival_step,
        token_budget=token_budget,
        block_size=block_size,
    )


def run_workload(
    model,
    workload: ChunkedWorkload,
    enable_chunked_prefill: bool,
    progress: StepProgress | None = None,
    model_id: str = "",
) -> Trace:
    """Run the workload once (greedy, capture "none"); the long prompt is added after ``arrival_step`` steps.

    Args:
        model: a loaded causal LM.
        workload: what to run.
        enable_chunked_prefill: chunk the long prompt into the budget left after decodes.
        progress: called after each step with (steps done in this run, the step record).
        model_id: a name for the trace.
    """
    engine = LLMEngine(model, None, workload.engine_config(enable_chunked_prefill), model_id=model_id)
    for i, prompt in enumerate(workload.short_prompts):
        engine.add_request(
            list(prompt), SamplingParams(max_new_tokens=workload.short_max_new_tokens), request_id=short_request_id(i)
        )
    if workload.arrival_step > 0 and engine.has_unfinished_requests():
        engine.run(max_steps=workload.arrival_step, progress=progress)
    steps_before = len(engine.steps)
    engine.add_request(
        list(workload.long_prompt), SamplingParams(max_new_tokens=workload.long_max_new_tokens),
        request_id=LONG_REQUEST_ID,
    )
    return engine.run(progress=offset_progress(progress, steps_before))


# ---------------------------------------------------------------- measurements
@dataclass
class LatencySummary:
    """What the users of one run felt, in milliseconds."""

    itl_p50_ms: float  # inter-token latency of the short (decoding) requests, all tokens pooled
    itl_p99_ms: float
    itl_max_ms: float
    long_ttft_ms: float  # long prompt: arrival to its first token
    num_steps: int
    total_ms: float  # first step start to last step end
    num_paused_decode_steps: int  # steps that left out a request in the middle of decoding


def short_request_ids(trace: Trace) -> list[str]:
    return [rid for rid in trace.requests if rid != LONG_REQUEST_ID]


def steps_after_arrival(trace: Trace) -> list[StepRecord]:
    """The steps that started after the long prompt arrived."""
    arrival = trace.requests[LONG_REQUEST_ID].arrival_time_s
    return [step for step in trace.steps if step.start_time_s >= arrival]


def paused_decode_steps(trace: Trace) -> list[int]:
    """Indices of steps that left out a request which had started decoding and was not done:
    its user saw no token in that step."""
    num_outputs = {rid: len(record.output_token_ids) for rid, record in trace.requests.items()}
    num_sampled = dict.fromkeys(trace.requests, 0)
    paused = []
    for step in trace.steps:
        decoding = {rid for rid, n in num_sampled.items() if 0 < n < num_outputs[rid]}
        if decoding - {chunk.request_id for chunk in step.chunks}:
            paused.append(step.step_index)
        for request_id in step.sampled_token_ids:
            num_sampled[request_id] += 1
    return paused


def latency_summary(trace: Trace) -> LatencySummary:
    itl_s = np.array([t for rid in short_request_ids(trace) for t in trace.requests[rid].inter_token_times_s])
    ttft = trace.requests[LONG_REQUEST_ID].time_to_first_token_s
    last = trace.steps[-1]

    def percentile(q: float) -> float:
        return float(np.percentile(itl_s, q) * 1000) if itl_s.size else float("nan")

    return LatencySummary(
        itl_p50_ms=percentile(50),
        itl_p99_ms=percentile(99),
        itl_max_ms=float(itl_s.max() * 1000) if itl_s.size else float("nan"),
        long_ttft_ms=ttft * 1000 if ttft is not None else float("nan"),
        num_steps=trace.num_steps,
        total_ms=(last.start_time_s + last.wall_time_s) * 1000,
        num_paused_decode_steps=len(paused_decode_steps(trace)),
    )


@dataclass
class ChunkedComparison:
    workload: ChunkedWorkload
    model_id: str
    device: str
    dtype: str
    off: Trace
    on: Trace

    @property
    def summary_off(self) -> LatencySummary:
        return latency_summary(self.off)

    @property
    def summary_on(self) -> LatencySummary:
        return latency_summary(self.on)

    @property
    def output_checks(self) -> list[OutputCheck]:
        return compare_outputs(self.off, self.on)


def compare_chunking(
    model, workload: ChunkedWorkload, progress: StepProgress | None = None, model_id: str = ""
) -> ChunkedComparison:
    """Warm up, then run the workload with chunking off and on (same tokens, greedy).

    ``progress`` counts steps across both runs.
    """
    short_warm_up(model)
    off = run_workload(model, workload, False, progress, model_id)
    on = run_workload(model, workload, True, offset_progress(progress, off.num_steps), model_id)
    return ChunkedComparison(workload, model_id, off.device, off.dtype, off, on)
