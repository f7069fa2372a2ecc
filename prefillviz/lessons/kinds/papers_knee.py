"""The ``papers_knee`` action: TTFT against N at small N, its knee, and the roofline's ridge in tokens
from this machine's measured peaks."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.experiments.model_setup import device_and_dtype
from prefillviz.experiments.papers_knee import run_knee
from prefillviz.figures import papers as figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import labelled_page_results, papers_outcome
from prefillviz.machine.progress import FractionProgress
from prefillviz.measure.peaks_history import machine_peaks


def weights_read_ms(model, peaks) -> float:
    """One read of the model's weights at the measured memory bandwidth (ms): the floor a step that is bound by
    reading its weights can't go under. Tied tensors are counted once."""
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return weight_bytes / (peaks.memory_gb_s * 1e9) * 1e3


def flat_part_text(read_ms: float, flat_ms: float) -> str:
    """What sets the flat part of TTFT against N here, from the weights' read time beside the fitted flat part."""
    if read_ms >= 0.5 * flat_ms:
        return f"reading the weights once takes {read_ms:,.2f} ms of the flat {flat_ms:,.1f} ms: the weights set it"
    return (f"reading the weights once takes only {read_ms:,.2f} ms of the flat {flat_ms:,.1f} ms: "
            "launch and host overhead set it, not the weights")


def _run(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    report(0.0, "reading (or measuring) this machine's peaks")
    peaks = machine_peaks(*device_and_dtype(loaded.model))
    result = run_knee(loaded, parameters["sizes"], parameters["runs"], peaks, report)
    fit = result.fit
    read_ms = weights_read_ms(loaded.model, peaks)
    measured = {
        "knee_tokens": fit.knee_tokens, "ridge_tokens": result.ridge_tokens,
        "knee_over_ridge": fit.knee_tokens / result.ridge_tokens,
        "flat_ms": fit.flat_ms, "ms_per_token_past_knee": fit.ms_per_token, "largest_tokens": result.sizes[-1],
        "largest_over_smallest": result.ttft_ms[-1] / result.ttft_ms[0],
        "ridge_intensity": peaks.ridge_intensity,
        "weights_read_ms": read_ms,
        "weights_read_share": read_ms / fit.flat_ms,  # of the flat part: reading the weights, or not
    }
    facts = [
        (
            "Knee of the measured TTFT (fit: flat, then rising)",
            f"N ≈ {fit.knee_tokens:,.0f} tokens "
            f"(flat part {fit.flat_ms:,.1f} ms, then {fit.ms_per_token:,.3f} ms per token)",
        ),
        (
            "Roofline ridge in tokens (measured peaks)",
            f"N ≈ {result.ridge_tokens:,} ({peaks.matmul_gflops:,.0f} GFLOP/s ÷ {peaks.memory_gb_s:,.1f} GB/s "
            f"= {peaks.ridge_intensity:,.1f} FLOP/byte)",
        ),
        (
            "The flat part, against reading the weights once at the measured bandwidth",
            flat_part_text(read_ms, fit.flat_ms),
        ),
        (
            f"TTFT at N={result.sizes[0]} and N={result.sizes[-1]:,}",
            f"{result.ttft_ms[0]:,.1f} ms and {result.ttft_ms[-1]:,.1f} ms",
        ),
    ]
    return papers_outcome(
        "papers_knee", loaded, parameters, measured, facts, result, "knee", "Source of the paper's curve"
    )


def _figure(outcome: ActionOutcome) -> go.Figure:
    return figures.knee_figure(outcome.raw["papers_knee"], None, "Time to first token against N: flat, then rising")


def _per_token_figure(outcome: ActionOutcome) -> go.Figure:
    return figures.knee_per_token_figure(
        outcome.raw["papers_knee"], None, "Time per prompt token (Sarathi-Serve Figure 2's view)"
    )


KIND = ActionKind(
    name="papers_knee",
    parameters={"sizes": (list, [4, 8, 16, 32, 64, 128, 256, 512]), "runs": (int, 3)},
    scaled={"sizes": 2},
    measured=(
        "knee_tokens", "ridge_tokens", "knee_over_ridge", "flat_ms", "ms_per_token_past_knee", "largest_tokens",
        "largest_over_smallest", "ridge_intensity", "weights_read_ms", "weights_read_share",
    ),
    figures={"knee": _figure, "per_token": _per_token_figure},
    run=_run,
    description="Time to first token against N at small N: where it stops being flat, beside the roofline's ridge.",
    page_results=labelled_page_results("papers_knee", "result"),
)
