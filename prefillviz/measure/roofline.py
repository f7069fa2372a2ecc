"""The roofline experiment: real engine steps timed and placed under this machine's roofs.

A prefill point is one parallel prefill step of N tokens, a decode point one decode step
at context C; their FLOPs and bytes come from ``flops.engine_step_costs``, the roofs from the
measured peaks (``measure.peaks_history``), the placing from ``analysis.roofline``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prefillviz.analysis.flops import engine_step_costs
from prefillviz.analysis.machine_peaks import MachinePeaks
from prefillviz.analysis.model_shape import model_shape
from prefillviz.analysis.roofline import RooflinePoint
from prefillviz.engine.errors import ConfigError
from prefillviz.engine.request import SamplingParams
from prefillviz.experiments.model_setup import device_and_dtype, model_tokenizer_and_id, token_ids_of_length
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.measure.peaks_history import machine_peaks

DEFAULT_PREFILL_SIZES = (16, 64, 256)
DEFAULT_DECODE_CONTEXTS = (64, 256)


@dataclass
class RooflineResult:
    """The machine's measured roofs and measured engine steps placed under them."""

    model_id: str
    device: str
    dtype: str
    peaks: MachinePeaks
    points: list[RooflinePoint]

    def rows(self) -> list[dict]:
        return [
            {
                "label": p.label,
                "phase": p.phase,
                "num_tokens": p.num_tokens,
                "context_len": p.context_len,
                "gflop": p.flops / 1e9,
                "megabytes": p.bytes / 1e6,
                "intensity_flop_per_byte": p.intensity,
                "forward_time_ms": p.measured_time_s * 1e3,
                "achieved_gflops": p.achieved_gflops,
            }
            for p in self.points
        ]


def run_roofline(
    loaded_or_pair: Any,
    prefill_sizes: Sequence[int] = DEFAULT_PREFILL_SIZES,
    decode_contexts: Sequence[int] = DEFAULT_DECODE_CONTEXTS,
    runs: int = 2,
    peaks: MachinePeaks | None = None,
) -> RooflineResult:
    """Measured peaks for the model's device and dtype (cached per machine) and measured points.

    Args:
        loaded_or_pair: a ``LoadedModel`` or ``(model, tokenizer)``.
        prefill_sizes: N of the one-step prefill points.
        decode_contexts: contexts C of the decode points.
        runs: timed runs per point (median).
        peaks: use these peaks instead of ``machine_peaks`` (tests).

    Raises:
        ConfigError: no size or context given.
    """
    if not prefill_sizes and not decode_contexts:
        raise ConfigError("Pick at least one prefill size or decode context to measure.")
    model, _, model_id = model_tokenizer_and_id(loaded_or_pair)
    device, dtype = device_and_dtype(model)
    peaks = peaks or machine_peaks(device, dtype)
    points = measure_roofline_points(loaded_or_pair, sorted(set(prefill_sizes)), sorted(set(decode_contexts)), runs)
    return RooflineResult(model_id, device, dtype, peaks, points)


def measure_roofline_points(
    loaded_or_pair: Any, prefill_sizes: Sequence[int], decode_contexts: Sequence[int], runs: int,
    max_tokens: int | None = None
) -> list[RooflinePoint]:
    """Times real engine steps and places them on the roofline.

    A prefill point is one parallel prefill step of N tokens (token budget >= N): median
    ``forward_time_s`` over ``runs`` fresh requests after one warm-up. A decode point at
    context C: a request of C - 2 prompt tokens generates 1 + ``runs`` more; its first
    decode step (context C - 1) is the warm-up, the next ``runs`` (contexts C .. C + runs
    - 1) are timed and their median kept.

    Args:
        loaded_or_pair: a ``LoadedModel`` or a ``(model, tokenizer)`` pair; the tokenizer
            may be None (prompts are then a fixed pattern of ids).
        prefill_sizes: prompt lengths N to time as one prefill step.
        decode_contexts: contexts C at which to time a decode step.
        runs: timed runs per point.
        max_tokens: skip sizes and contexts above this (also capped by the model's context).

    Returns:
        The points, prefill first, in the order given.
    """
    model, tokenizer, _ = model_tokenizer_and_id(loaded_or_pair)
    info = model_shape(model)
    limit = min(max_tokens or math.inf, info.max_context or math.inf)
    prefill_sizes = [n for n in prefill_sizes if n <= limit]
    decode_contexts = [c for c in decode_contexts if 3 <= c and c + runs <= limit]
    longest = max([*prefill_sizes, *(c + runs for c in decode_contexts), 16])
    # one request at a time, each computed again
    engine = one_request_engine(model, tokenizer, token_budget=longest, num_tokens=longest)
    engine.add_request(token_ids_of_length(tokenizer, info.vocab_size, 8))  # first-call overheads out of the way
    engine.run()

    points = []
    for n in prefill_sizes:
        token_ids = token_ids_of_length(tokenizer, info.vocab_size, n)
        times_s = []
        for run in range(runs + 1):  # run 0 warms up this shape
            engine.add_request(token_ids, SamplingParams(max_new_tokens=1))
            step = engine.step()
            if run > 0:
                times_s.append(step.forward_time_s)
        points.append(_point(f"prefill N={n}", "prefill", model, n, n, times_s))
    for context in decode_contexts:
        engine.add_request(token_ids_of_length(tokenizer, info.vocab_size, context - 2),
                           SamplingParams(max_new_tokens=2 + runs))
        steps = engine.run().steps[-(2 + runs):]  # prefill, warm-up decode, timed decodes
        times_s = [step.forward_time_s for step in steps[2:]]
        points.append(_point(f"decode ctx={context}", "decode", model, 1, context, times_s))
    return points


def _point(label: str, phase: str, model: Any, num_tokens: int, context_len: int,
           times_s: list[float]) -> RooflinePoint:
    cost = engine_step_costs(model, num_tokens, context_len)
    return RooflinePoint.measured(label, phase, num_tokens, context_len, cost.total_flops, cost.total_bytes,
                                  statistics.median(times_s))
