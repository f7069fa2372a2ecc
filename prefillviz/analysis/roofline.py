"""Roofline data: where prefill and decode steps sit between the memory and compute roofs.

The roofline model (Williams, Waterman, Patterson 2009): a kernel that does F FLOPs while
moving B bytes can run no faster than ``min(peak FLOP/s, bandwidth x F/B)``. Prefill runs
N tokens through every weight at once (intensity grows with N: compute-bound), decode runs
one (intensity ~ 2 / dtype_bytes FLOPs per byte: memory-bound).

    GFLOP/s
      |            ___________________ peak matmul (measured, peaks.py)
      |          /     * prefill N=1024
      |        /   * prefill N=64
      |      /  <- slope = memory bandwidth
      |    / * decode
      +--------|------------------- FLOPs / byte
             ridge = peak / bandwidth

Points are measured on real engine steps (``LLMEngine``, one step = one model forward);
their FLOPs and bytes come from ``flops.model_costs``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from prefillviz.analysis.flops import layer_op_costs, model_costs
from prefillviz.analysis.peaks import MachinePeaks
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.engine.request import SamplingParams
from prefillviz.models import model_info
from prefillviz.prompts import bench_token_ids

DEFAULT_PREFILL_SIZES = (16, 64, 256, 1024, 4096)
DEFAULT_DECODE_CONTEXTS = (256, 1024, 4096)


@dataclass
class RooflinePoint:
    """One measured engine step placed on the roofline.

    Attributes:
        label: e.g. ``"prefill N=64"`` or ``"decode ctx=1024"``.
        phase: ``"prefill"`` (one parallel step of N prompt tokens) or ``"decode"``.
        num_tokens: tokens run in the step (N; 1 for decode).
        context_len: keys the last token attends to (N for prefill).
        flops: FLOPs of the step (``model_costs(...).total_flops``, causal attention).
        bytes: bytes the step must move (``model_costs(...).total_bytes``).
        intensity: ``flops / bytes``.
        measured_time_s: median ``forward_time_s`` of the step over the runs.
        achieved_gflops: ``flops / measured_time_s / 1e9``.
    """

    label: str
    phase: str
    num_tokens: int
    context_len: int
    flops: int
    bytes: int
    intensity: float
    measured_time_s: float
    achieved_gflops: float


def roof(peaks: MachinePeaks, intensities: Iterable[float]) -> list[float]:
    """Attainable GFLOP/s at each intensity: ``min(peak, bandwidth x intensity)``.

    Args:
        peaks: the measured machine peaks.
        intensities: arithmetic intensities in FLOPs per byte.

    Returns:
        GFLOP/s, one per intensity.
    """
    return [min(peaks.matmul_gflops, peaks.memory_gb_s * intensity) for intensity in intensities]


def ridge_point(peaks: MachinePeaks) -> float:
    """The intensity (FLOPs/byte) where the memory roof meets the compute roof."""
    return peaks.ridge_intensity


def predict_layer_times(
    info: Any, num_new_tokens: int, context_len: int, dtype_bytes: int | None, peaks: MachinePeaks
) -> list[dict]:
    """Roofline prediction of each op of one decoder layer.

    Args:
        info: a ``ModelInfo``, transformers config, model or ``LoadedModel``.
        num_new_tokens: tokens in the step (N).
        context_len: keys the last token attends to (C >= N).
        dtype_bytes: bytes per element; None takes the model's.
        peaks: the machine's measured peaks.

    Returns:
        One dict per op: ``op``, ``flops``, ``bytes``, ``intensity``, ``predicted_s`` =
        ``max(flops / peak, bytes / bandwidth)`` and ``bound`` (``"compute"`` or ``"memory"``,
        whichever term is larger).
    """
    predictions = []
    for op in layer_op_costs(info, num_new_tokens, context_len, dtype_bytes):
        compute_s = op.flops / (peaks.matmul_gflops * 1e9)
        memory_s = op.bytes / (peaks.memory_gb_s * 1e9)
        predictions.append(
            dict(
                op=op.name,
                flops=op.flops,
                bytes=op.bytes,
                intensity=op.arithmetic_intensity,
                predicted_s=max(compute_s, memory_s),
                bound="compute" if compute_s >= memory_s else "memory",
            )
        )
    return predictions


def _model_and_tokenizer(loaded_or_model_and_tokenizer: Any) -> tuple[Any, Any]:
    if isinstance(loaded_or_model_and_tokenizer, tuple):
        return loaded_or_model_and_tokenizer
    return loaded_or_model_and_tokenizer.model, loaded_or_model_and_tokenizer.tokenizer


def _prompt_ids(tokenizer: Any, vocab_size: int, num_tokens: int) -> list[int]:
    """Real prose when there is a tokenizer; a fixed id pattern for bare test models."""
    if tokenizer is not None:
        return bench_token_ids(tokenizer, num_tokens)
    return [(7 * i + 3) % vocab_size for i in range(num_tokens)]


def _point(label: str, phase: str, model: Any, num_tokens: int, context_len: int, times_s: list[float]) -> RooflinePoint:
    cost = model_costs(model, num_tokens, context_len)
    time_s = statistics.median(times_s)
    return RooflinePoint(
        label=label,
        phase=phase,
        num_tokens=num_tokens,
        context_len=context_len,
        flops=cost.total_flops,
        bytes=cost.total_bytes,
        intensity=cost.arithmetic_intensity,
        measured_time_s=time_s,
        achieved_gflops=cost.total_flops / time_s / 1e9,
    )


def measure_roofline_points(
    loaded_or_model_and_tokenizer: Any,
    prefill_sizes: Sequence[int] = DEFAULT_PREFILL_SIZES,
    decode_contexts: Sequence[int] = DEFAULT_DECODE_CONTEXTS,
    runs: int = 3,
    max_tokens: int | None = None,
) -> list[RooflinePoint]:
    """Times real engine steps and places them on the roofline.

    A prefill point is one parallel prefill step of N tokens (token budget >= N): median
    ``forward_time_s`` over ``runs`` fresh requests after one warm-up. A decode point at
    context C: a request of C - 2 prompt tokens generates 1 + ``runs`` more; its first
    decode step (context C - 1) is the warm-up, the next ``runs`` (contexts C .. C + runs
    - 1) are timed and their median kept.

    Args:
        loaded_or_model_and_tokenizer: a ``LoadedModel`` or a ``(model, tokenizer)`` pair;
            the tokenizer may be None (prompts are then a fixed pattern of ids).
        prefill_sizes: prompt lengths N to time as one prefill step.
        decode_contexts: contexts C at which to time a decode step.
        runs: timed runs per point.
        max_tokens: skip sizes and contexts above this (also capped by the model's context).

    Returns:
        The points, prefill first, in the order given.
    """
    model, tokenizer = _model_and_tokenizer(loaded_or_model_and_tokenizer)
    info = model_info(model)
    limit = min(max_tokens or math.inf, info.max_context or math.inf)
    prefill_sizes = [n for n in prefill_sizes if n <= limit]
    decode_contexts = [c for c in decode_contexts if 3 <= c and c + runs <= limit]
    longest = max([*prefill_sizes, *(c + runs for c in decode_contexts), 16])
    engine = one_request_engine(model, tokenizer, token_budget=longest, num_tokens=longest)  # one request at a time, each computed again
    engine.add_request(_prompt_ids(tokenizer, info.vocab_size, 8))  # first-call overheads out of the way
    engine.run()

    points = []
    for n in prefill_sizes:
        token_ids = _prompt_ids(tokenizer, info.vocab_size, n)
        times_s = []
        for run in range(runs + 1):  # run 0 warms up this shape
            engine.add_request(token_ids, SamplingParams(max_new_tokens=1))
            step = engine.step()
            if run > 0:
                times_s.append(step.forward_time_s)
        points.append(_point(f"prefill N={n}", "prefill", model, n, n, times_s))
    for context in decode_contexts:
        engine.add_request(_prompt_ids(tokenizer, info.vocab_size, context - 2), SamplingParams(max_new_tokens=2 + runs))
        steps = engine.run().steps[-(2 + runs):]  # prefill, warm-up decode, timed decodes
        times_s = [step.forward_time_s for step in steps[2:]]
        points.append(_point(f"decode ctx={context}", "decode", model, 1, context, times_s))
    return points
