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

Points are measured on real engine steps (``experiments.roofline``: one step = one model
forward); their FLOPs and bytes come from ``flops.model_costs``. This module only computes
on what was measured.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from prefillviz.analysis.flops import layer_op_costs
from prefillviz.analysis.machine_peaks import MachinePeaks


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

    @classmethod
    def measured(
        cls, label: str, phase: str, num_tokens: int, context_len: int, flops: int, bytes_moved: int, time_s: float
    ) -> RooflinePoint:
        """The point of a step (or steps together) that did ``flops`` moving ``bytes_moved`` in ``time_s``."""
        return cls(
            label, phase, num_tokens, context_len, flops, bytes_moved, flops / bytes_moved, time_s, flops / time_s / 1e9
        )


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
    info: Any,
    num_new_tokens: int,
    context_len: int,
    dtype_bytes: int | None,
    peaks: MachinePeaks,
    kept_rows: int | None = None,
) -> list[dict]:
    """Roofline prediction of each op of one decoder layer.

    Args:
        info: a ``ModelShape``, transformers config, model or ``LoadedModel``.
        num_new_tokens: tokens in the step (N).
        context_len: keys the last token attends to (C >= N).
        dtype_bytes: bytes per element; None takes the model's.
        peaks: the machine's measured peaks.
        kept_rows: the last rows, the only ones that attend and go on (None: all; the engine's last layer:
            the kept ones).

    Returns:
        One dict per op: ``op``, ``flops``, ``bytes``, ``intensity``, ``predicted_s`` =
        ``max(flops / peak, bytes / bandwidth)`` and ``bound`` (``"compute"`` or ``"memory"``,
        whichever term is larger).
    """
    predictions = []
    for op in layer_op_costs(info, num_new_tokens, context_len, dtype_bytes, kept_rows):
        compute_s = op.flops / (peaks.matmul_gflops * 1e9)
        memory_s = op.bytes / (peaks.memory_gb_s * 1e9)
        predictions.append(
            {
                "op": op.name,
                "flops": op.flops,
                "bytes": op.bytes,
                "intensity": op.arithmetic_intensity,
                "predicted_s": max(compute_s, memory_s),
                "bound": "compute" if compute_s >= memory_s else "memory",
            }
        )
    return predictions
