"""The same prompt two ways (``experiments.ways``): one parallel step, or one token per step.

Each way runs twice:

* a **timing pass** (capture ``"none"``: no hooks, nothing copied) after a warm-up, for the
  times, the per-step latencies and tokens/s;
* an **inspection pass** (capture ``"inspect"``) that keeps the post-RoPE keys and values
  written to the KV cache in every layer, and the first-token logits, to prove both ways
  filled the same cache and predict the same next token (``experiments.kv_equality``).

The prompt's two timing passes are also placed on the roofline (``analysis.roofline``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefillviz.analysis.flops import engine_step_costs
from prefillviz.analysis.roofline import RooflinePoint
from prefillviz.analysis.rounding import longest_sum
from prefillviz.engine.errors import ConfigError, RequestError
from prefillviz.engine.request_checks import check_prompt_text
from prefillviz.engine.trace import Trace
from prefillviz.experiments.kv_equality import EqualityCheck, compare_inspections
from prefillviz.experiments.model_setup import device_and_dtype, model_tokenizer_and_id
from prefillviz.experiments.ways import (
    PARALLEL,
    REQUEST_ID,
    TOKEN_BY_TOKEN,
    run_way,
    time_to_first_token_s,
    warm_up_both_ways,
)
from prefillviz.machine.load import LoadReading, MachineLoad
from prefillviz.machine.progress import FractionProgress, ProgressCounter, StepProgress


@dataclass
class WayRun:
    """One way of prefilling the prompt: its timing pass (kept) and how the inspection pass went.

    Attributes:
        way: ``"parallel"`` or ``"token-by-token"``.
        token_budget: the engine's token budget (N or 1).
        timing: the timing pass kept (capture ``"none"``); for parallel, the run with the
            median time to first token.
        timing_runs_s: time to first token of every timing run.
        inspection_num_steps: steps the inspection pass took (N or 1, like the timing pass).
        inspection_time_s: the inspection pass's time to first token (slower: it copies tensors).
    """

    way: str
    token_budget: int
    timing: Trace
    timing_runs_s: list[float]
    inspection_num_steps: int
    inspection_time_s: float

    @classmethod
    def from_passes(cls, way: str, token_budget: int, timings: list[Trace], inspection: Trace) -> WayRun:
        """Keeps the timing run with the median time to first token (the lower one of an even count)."""
        times = [time_to_first_token_s(trace) for trace in timings]
        median_run = sorted(range(len(times)), key=times.__getitem__)[(len(times) - 1) // 2]
        return cls(
            way, token_budget, timings[median_run], times, inspection.num_steps, time_to_first_token_s(inspection)
        )

    @property
    def record(self):
        return self.timing.requests[REQUEST_ID]

    @property
    def num_steps(self) -> int:
        return self.timing.num_steps

    @property
    def time_to_first_token_s(self) -> float:
        """Request arrival (already tokenized) to its first token sampled: all N or 1 steps."""
        return self.record.time_to_first_token_s

    @property
    def step_wall_times_s(self) -> list[float]:
        return [step.wall_time_s for step in self.timing.steps]

    @property
    def forward_time_s(self) -> float:
        """Model forward time summed over the steps."""
        return sum(step.forward_time_s for step in self.timing.steps)

    @property
    def tokens_per_s(self) -> float:
        """Prompt tokens processed per second of time to first token."""
        return self.record.num_prompt_tokens / self.time_to_first_token_s


@dataclass
class ParallelComparison:
    """One prompt prefilled both ways, timed and checked. Built by ``run_both_ways``."""

    model_id: str
    device: str
    dtype: str
    prompt: str
    token_ids: list[int]
    num_prompt_tokens_before_cut: int  # the prompt's length before ``max_tokens`` cut it
    parallel: WayRun
    token_by_token: WayRun
    equality: EqualityCheck
    roofline_points: list[RooflinePoint] = field(default_factory=list)  # this prompt, both ways
    machine_load: LoadReading | None = None  # other processes' CPU use during the timing passes

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def ratio(self) -> float:
        """Token-by-token time to first token over parallel's."""
        return self.token_by_token.time_to_first_token_s / self.parallel.time_to_first_token_s

    def way(self, name: str) -> WayRun:
        return self.parallel if name == PARALLEL else self.token_by_token

    def step_rows(self) -> list[dict]:
        """Every timed step of both ways (timing pass), for downloads."""
        return [
            {
                "way": run.way,
                "step": step.step_index + 1,
                "tokens": step.num_scheduled_tokens,
                "start_ms": step.start_time_s * 1e3,
                "wall_time_ms": step.wall_time_s * 1e3,
                "forward_time_ms": step.forward_time_s * 1e3,
            }
            for run in (self.parallel, self.token_by_token)
            for step in run.timing.steps
        ]

    def summary(self) -> dict:
        """JSON-ready headline numbers."""
        return {
            "model": self.model_id,
            "device": self.device,
            "dtype": self.dtype,
            "num_prompt_tokens": self.num_tokens,
            "ratio_token_by_token_over_parallel": self.ratio,
            **{
                run.way: {
                    "token_budget": run.token_budget,
                    "num_steps": run.num_steps,
                    "time_to_first_token_s": run.time_to_first_token_s,
                    "timing_runs_s": run.timing_runs_s,
                    "forward_time_s": run.forward_time_s,
                    "tokens_per_s": run.tokens_per_s,
                    "inspection_num_steps": run.inspection_num_steps,
                }
                for run in (self.parallel, self.token_by_token)
            },
            "equality": {
                "relative_tolerance": self.equality.relative_tolerance,
                "tolerance": self.equality.describe_tolerance(),
                "passed": self.equality.passed,
                "relative_diff": self.equality.relative_diff,
                "max_key_diff": self.equality.max_key_diff,
                "max_value_diff": self.equality.max_value_diff,
                "logits_max_abs_diff": self.equality.logits_max_abs_diff,
                "probs_max_abs_diff": self.equality.probs_max_abs_diff,
            },
        }


def prompt_token_ids(tokenizer: Any, prompt: str | list[int], max_tokens: int | None = None) -> tuple[list[int], int]:
    """The prompt's token ids, cut to the first ``max_tokens``; and its length before the cut.

    Raises:
        RequestError: the prompt is empty, or text was given without a tokenizer.
    """
    if isinstance(prompt, str):
        check_prompt_text(prompt)
        if tokenizer is None:
            raise RequestError("This model has no tokenizer: give the prompt as token ids.")
        token_ids = list(tokenizer(prompt)["input_ids"])
    else:
        token_ids = [int(t) for t in prompt]
    if not token_ids:
        raise RequestError("The prompt is empty: it has no tokens.")
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"The token limit must be at least 1, got {max_tokens}.")
    return token_ids[:max_tokens] if max_tokens else token_ids, len(token_ids)


def _prompt_roofline_points(
    model: Any, parallel: WayRun, token_by_token: WayRun, num_tokens: int
) -> list[RooflinePoint]:
    """This prompt on the roofline: the parallel step, and all token-by-token steps together
    (their FLOPs, bytes and forward times summed)."""
    cost = engine_step_costs(model, num_tokens, num_tokens)
    flops, bytes_moved = 0, 0
    for step in token_by_token.timing.steps:
        chunk = step.chunks[0]  # the one request's token: position chunk.start_position
        step_cost = engine_step_costs(model, chunk.num_tokens, chunk.start_position + chunk.num_tokens)
        flops, bytes_moved = flops + step_cost.total_flops, bytes_moved + step_cost.total_bytes
    parallel_label = f"this prompt, parallel (1 step, N={num_tokens})"
    token_by_token_label = f"this prompt, token-by-token ({token_by_token.num_steps} steps together)"
    return [
        RooflinePoint.measured(
            parallel_label, PARALLEL, num_tokens, num_tokens, cost.total_flops, cost.total_bytes,
            parallel.forward_time_s,
        ),
        RooflinePoint.measured(
            token_by_token_label, TOKEN_BY_TOKEN, num_tokens, num_tokens, flops, bytes_moved,
            token_by_token.forward_time_s,
        ),
    ]


def run_both_ways(
    loaded_or_pair: Any,
    prompt: str | list[int],
    max_tokens: int | None = None,
    parallel_timing_runs: int = 3,
    progress: FractionProgress | None = None,
) -> ParallelComparison:
    """Prefill one prompt in one step and token by token: timing passes, then inspection passes.

    Order: warm-up; ``parallel_timing_runs`` parallel timing runs (the median is kept) and
    one token-by-token timing run (N steps), all capture ``"none"``; then one inspection
    pass each way (capture ``"inspect"``), compared by ``compare_inspections``.

    Args:
        loaded_or_pair: a ``LoadedModel`` or a ``(model, tokenizer)`` pair (tokenizer may be
            None when the prompt is token ids).
        prompt: text, or token ids.
        max_tokens: use only the first ``max_tokens`` tokens (None: all).
        parallel_timing_runs: timed parallel runs (cheap: one step each).
        progress: called with (fraction done, what is running).

    Raises:
        RequestError: empty prompt, or too long for the model.
    """
    model, tokenizer, model_id = model_tokenizer_and_id(loaded_or_pair)
    token_ids, length_before_cut = prompt_token_ids(tokenizer, prompt, max_tokens)
    n = len(token_ids)
    runs = max(1, parallel_timing_runs)
    # warm-up, timing runs (parallel, N steps), inspection (1, N steps)
    counter = ProgressCounter(progress, total_units=1 + runs + n + 1 + n)

    def one_token_steps(pass_name: str) -> StepProgress | None:
        return counter.per_step(lambda steps_done: f"{pass_name}: token-by-token step {steps_done} of {n}")

    counter.advance("warming up", 0)
    warm_up_both_ways(model, tokenizer, token_ids)
    counter.advance("warm-up done")
    with MachineLoad() as load:
        parallel_timings = []
        for run in range(runs):
            parallel_timings.append(run_way(model, tokenizer, token_ids, token_budget=n))
            counter.advance(f"timing pass: parallel run {run + 1} of {runs}")
        sequential_timing = run_way(model, tokenizer, token_ids, 1, progress=one_token_steps("timing pass"))
    parallel_inspection = run_way(model, tokenizer, token_ids, n, "inspect")
    counter.advance("inspection pass: parallel")
    sequential_inspection = run_way(model, tokenizer, token_ids, 1, "inspect", one_token_steps("inspection pass"))
    counter.advance("comparing the KV caches", 0)

    parallel = WayRun.from_passes(PARALLEL, n, parallel_timings, parallel_inspection)
    token_by_token = WayRun.from_passes(TOKEN_BY_TOKEN, 1, [sequential_timing], sequential_inspection)
    device, dtype = device_and_dtype(model)
    return ParallelComparison(
        model_id=model_id,
        device=device,
        dtype=dtype,
        prompt=prompt if isinstance(prompt, str) else "",
        token_ids=token_ids,
        num_prompt_tokens_before_cut=length_before_cut,
        parallel=parallel,
        token_by_token=token_by_token,
        equality=compare_inspections(parallel_inspection, sequential_inspection, longest_sum(model.config, n)),
        roofline_points=_prompt_roofline_points(model, parallel, token_by_token, n),
        machine_load=load.reading,
    )
