"""What chunking costs the prefill itself (Sarathi-Serve, OSDI'24, Figure 9a).

One prompt of N tokens, alone on a fresh engine, prefilled whole (token budget N: one step) and in
chunks of c tokens (budget c: ceil(N / c) steps); its time to first token each way, and the
overhead of each chunk size over the whole prefill (timing pass, medians of interleaved runs):

    whole        [P P P P P P P P]                              one step, weights read once
    chunks of c  [P P] [P P] [P P] [P P]                        N / c steps: the weights are read
                  '--'  '--'  reads the K/V of the chunks before   again every step, the matmuls are
                                                                   c rows instead of N
Every chunk after the first also attends over the K/V the earlier chunks cached: the FLOPs are
the same as one causal pass, but they run in smaller pieces, and the cached K/V is read again.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from prefillviz.analysis.model_shape import model_shape
from prefillviz.engine.errors import ConfigError
from prefillviz.experiments.model_setup import device_and_dtype, model_tokenizer_and_id, token_ids_of_length
from prefillviz.experiments.one_request import OnePrompt
from prefillviz.experiments.warm_up import short_warm_up
from prefillviz.machine.progress import FractionProgress, ProgressCounter

WHOLE = 0  # the chunk size of "no chunking" in rows and results


@dataclass
class ChunkCostPoint:
    prompt_tokens: int
    chunk_size: int  # WHOLE: one step
    num_steps: int
    time_to_first_token_ms: float  # median
    runs_ms: list[float]
    overhead: float  # this TTFT over the whole prefill's (1.0 for WHOLE)
    weight_reads: int  # how often the weights were read: one per step
    kv_reread_tokens: int  # K/V entries read again by later chunks: the sum of each chunk's start position


@dataclass
class ChunkCostResult:
    model_id: str
    device: str
    dtype: str
    runs: int
    points: list[ChunkCostPoint]  # by prompt length, then chunk size (WHOLE first)

    def rows(self) -> list[dict]:
        return [
            {
                "prompt_tokens": p.prompt_tokens, "chunk_size": p.chunk_size or "whole", "steps": p.num_steps,
                "ttft_ms": p.time_to_first_token_ms, "overhead_vs_whole": p.overhead, "weight_reads": p.weight_reads,
                "kv_tokens_reread": p.kv_reread_tokens, "runs_ms": p.runs_ms,
            }
            for p in self.points
        ]

    def mean_overhead(self, chunk_size: int) -> float:
        """The overhead of one chunk size, averaged over the prompt lengths it was run at (smaller than the prompt)."""
        values = [p.overhead for p in self.points if p.chunk_size == chunk_size]
        return statistics.mean(values) if values else float("nan")

    @property
    def chunk_sizes(self) -> list[int]:
        return sorted({p.chunk_size for p in self.points if p.chunk_size != WHOLE})


def kv_reread_tokens(prompt_tokens: int, chunk_size: int) -> int:
    """K/V entries the chunks after the first read back from the cache: each chunk starts at c·i."""
    if chunk_size == WHOLE or chunk_size >= prompt_tokens:
        return 0
    return sum(start for start in range(0, prompt_tokens, chunk_size))


def way_name(chunk_size: int) -> str:
    """One way of prefilling in words (progress messages): "whole", or "chunks of c"."""
    return "whole" if chunk_size == WHOLE else f"chunks of {chunk_size}"


def chunk_cost_points(
    prompt_tokens: int, ways: list[int], times_ms: dict[int, list[float]], steps: dict[int, int]
) -> list[ChunkCostPoint]:
    """One prompt length's points from its timed runs (TTFT in ms and steps, by chunk size): each way's
    median, and its overhead over the whole prefill's."""
    whole = statistics.median(times_ms[WHOLE])
    points = []
    for c in ways:
        median = statistics.median(times_ms[c])
        points.append(ChunkCostPoint(
            prompt_tokens, c, steps[c], median, times_ms[c], median / whole, steps[c],
            kv_reread_tokens(prompt_tokens, c),
        ))
    return points


def run_chunk_cost(
    loaded_or_pair, prompt_sizes: list[int], chunk_sizes: list[int], runs: int = 2,
    progress: FractionProgress | None = None,
) -> ChunkCostResult:
    """Each prompt length whole and in each chunk size smaller than it; ``runs`` timed runs each
    after one untimed round, the ways interleaved run by run.

    Raises:
        ConfigError: no prompt length or chunk size, a value below 1, or a prompt past the model's context.
    """
    model, tokenizer, model_id = model_tokenizer_and_id(loaded_or_pair)
    prompt_sizes, chunk_sizes = sorted({int(n) for n in prompt_sizes}), sorted({int(c) for c in chunk_sizes})
    if not prompt_sizes or not chunk_sizes or prompt_sizes[0] < 1 or chunk_sizes[0] < 1:
        raise ConfigError("Pick at least one prompt length and one chunk size, each a whole number >= 1.")
    limit = model_shape(model).max_context or math.inf
    if prompt_sizes[-1] + 1 > limit:
        raise ConfigError(f"A prompt of {prompt_sizes[-1]:,} tokens is past the model's context ({int(limit):,}).")
    plan = [(n, [WHOLE] + [c for c in chunk_sizes if c < n]) for n in prompt_sizes]
    counter = ProgressCounter(progress, sum(len(ways) for _, ways in plan) * (runs + 1))
    short_warm_up(model)
    points = []
    for n, ways in plan:
        token_ids = token_ids_of_length(tokenizer, model.config.vocab_size, n)
        times: dict[int, list[float]] = {c: [] for c in ways}
        steps: dict[int, int] = {}
        for run in range(runs + 1):  # round 0 warms every shape up
            for c in ways:
                trace, request_id = OnePrompt(model, tokenizer, token_ids, token_budget=c or n)()
                if run > 0:
                    times[c].append(trace.requests[request_id].time_to_first_token_s * 1000)
                steps[c] = trace.num_steps
                counter.advance(f"N={n:,}, {way_name(c)}: round {run + 1} of {runs + 1} (the first warms up)")
        points.extend(chunk_cost_points(n, ways, times, steps))
    return ChunkCostResult(model_id, *device_and_dtype(model), runs, points)
