"""The ``roofline`` action: measured prefill and decode steps under this machine's measured roofs."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.analysis.flops import model_costs
from prefillviz.analysis.model_shape import model_shape
from prefillviz.figures import parallel as parallel_figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import make_outcome
from prefillviz.lessons.spec import LessonError
from prefillviz.machine.progress import FractionProgress
from prefillviz.measure.roofline import measure_roofline_points, run_roofline

PAST_RIDGE_MARGIN = 1.5  # the size past the ridge: the smallest doubling whose intensity is 1.5x the ridge's


def size_past_ridge(loaded, start: int, ridge_intensity: float) -> int:
    """The smallest of start, 2·start, 4·start, ... (up to the model's context) whose prefill step's
    intensity, from the FLOP model, is ``PAST_RIDGE_MARGIN`` times the measured ridge; the largest if none is."""
    limit = model_shape(loaded).max_context or start
    n = start
    while model_costs(loaded, n, n).arithmetic_intensity < PAST_RIDGE_MARGIN * ridge_intensity and n * 2 <= limit:
        n *= 2
    return n


def weights_only_intensity(loaded, num_new_tokens: int, context_len: int) -> float:
    """FLOPs of a step per byte of weights it reads: the standard roofline's count, which leaves the
    activations and the KV cache out (as if kernels kept them on chip)."""
    cost = model_costs(loaded, num_new_tokens, context_len)
    return cost.total_flops / sum(op.weight_bytes for _, op in cost.all_ops)


def _run_roofline(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    report(0.0, "reading (or measuring) this machine's peaks, then timing prefill and decode steps")
    result = run_roofline(loaded, parameters["prefill_sizes"], parameters["decode_contexts"], parameters["runs"])
    prefill_points = [p for p in result.points if p.phase == "prefill"]
    decode_points = [p for p in result.points if p.phase == "decode"]
    if not prefill_points or not decode_points:
        raise LessonError("roofline: the model's context is too short for these prefill sizes and decode contexts.")
    prefill_point = max(prefill_points, key=lambda p: p.num_tokens)
    decode_point = min(decode_points, key=lambda p: p.context_len)
    peaks = result.peaks
    past_ridge = prefill_point
    if parameters["past_ridge"]:  # this device's ridge decides the size: a CPU's is passed early, a GPU's late
        n = size_past_ridge(loaded, prefill_point.num_tokens, peaks.ridge_intensity)
        if n != prefill_point.num_tokens:
            report(0.8, f"a prefill of {n:,} tokens, past this device's ridge")
            past_ridge = measure_roofline_points(loaded, [n], [], parameters["runs"])[0]
            result.points.append(past_ridge)
    measured = {
        "prefill_tokens": prefill_point.num_tokens,
        "prefill_intensity": prefill_point.intensity,
        "decode_intensity": decode_point.intensity,
        "intensity_ratio": prefill_point.intensity / decode_point.intensity,
        "ridge_intensity": peaks.ridge_intensity,
        "prefill_over_ridge": prefill_point.intensity / peaks.ridge_intensity,
        "prefill_gflops": prefill_point.achieved_gflops,
        "decode_gflops": decode_point.achieved_gflops,
        "gflops_ratio": prefill_point.achieved_gflops / decode_point.achieved_gflops,
        "prefill_percent_of_peak": 100 * prefill_point.achieved_gflops / peaks.matmul_gflops,
        "decode_percent_of_peak": 100 * decode_point.achieved_gflops / peaks.matmul_gflops,
        "prefill_weights_intensity": weights_only_intensity(loaded, prefill_point.num_tokens, prefill_point.num_tokens),
        "decode_weights_intensity": weights_only_intensity(loaded, 1, decode_point.context_len),
        "decode_intensity_limit": 2 / model_costs(loaded, 1, 1).dtype_bytes,  # 2 FLOPs per weight / bytes per weight
        "past_ridge_tokens": past_ridge.num_tokens,
        "past_ridge_over_ridge": past_ridge.intensity / peaks.ridge_intensity,
        "past_ridge_percent_of_peak": 100 * past_ridge.achieved_gflops / peaks.matmul_gflops,
    }
    facts = [
        (f"Prefill step, N={prefill_point.num_tokens}", _point_text(prefill_point, peaks)),
        (f"Decode step, context {decode_point.context_len}", _point_text(decode_point, peaks)),
        (
            "Counting the weights' bytes only (the standard roofline), prefill / decode",
            f"{measured['prefill_weights_intensity']:,.1f} / {measured['decode_weights_intensity']:,.2f} FLOP/byte",
        ),
        ("Ridge point (where the roofs meet)", f"{peaks.ridge_intensity:,.1f} FLOP/byte"),
        (f"Prefill N={prefill_point.num_tokens}", _side_of_ridge(prefill_point.intensity, peaks.ridge_intensity)),
        (f"Decode, context {decode_point.context_len}", _side_of_ridge(decode_point.intensity, peaks.ridge_intensity)),
        *(
            [(f"Prefill N={past_ridge.num_tokens}, sized past this device's ridge",
              f"{_point_text(past_ridge, peaks)}; {_side_of_ridge(past_ridge.intensity, peaks.ridge_intensity)}")]
            if past_ridge is not prefill_point else []
        ),
        (
            "This machine's roofs (measured)",
            f"{peaks.matmul_gflops:,.0f} GFLOP/s matmul · {peaks.memory_gb_s:,.1f} GB/s memory",
        ),
    ]
    return make_outcome("roofline", loaded, parameters, measured, facts, {"roofline": result})


def _point_text(point, peaks) -> str:
    percent = 100 * point.achieved_gflops / peaks.matmul_gflops
    return (
        f"{point.intensity:,.2f} FLOP/byte · {point.achieved_gflops:,.1f} GFLOP/s ({percent:.2g}% of the matmul peak)"
    )


def _side_of_ridge(intensity: float, ridge: float) -> str:
    if intensity >= ridge:
        return f"right of the ridge ({intensity / ridge:,.1f}× its intensity): compute-bound"
    return f"left of the ridge ({ridge / intensity:,.1f}× below it): memory-bound"


def _roofline_figure(outcome: ActionOutcome) -> go.Figure:
    result = outcome.raw["roofline"]
    return parallel_figures.roofline_figure(result.peaks, result.points)


KIND = ActionKind(
    name="roofline",
    parameters={
        "prefill_sizes": (list, [16, 64, 256]), "decode_contexts": (list, [64]), "runs": (int, 2),
        "past_ridge": (bool, False),
    },
    scaled={"prefill_sizes": 4, "decode_contexts": 4},
    measured=(
        "prefill_tokens", "prefill_intensity", "decode_intensity", "intensity_ratio", "ridge_intensity",
        "prefill_over_ridge",
        "prefill_gflops", "decode_gflops", "gflops_ratio", "prefill_percent_of_peak", "decode_percent_of_peak",
        "decode_intensity_limit", "prefill_weights_intensity", "decode_weights_intensity",
        "past_ridge_tokens", "past_ridge_over_ridge", "past_ridge_percent_of_peak",
    ),
    figures={"roofline": _roofline_figure},
    run=_run_roofline,
    description="Prefill and decode steps, timed and placed under this machine's measured roofs.",
    page_results=lambda run, label: {"parallel_roofline": run.raw["roofline"]},
)
