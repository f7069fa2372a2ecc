"""Figures of the parallel vs token-by-token comparison: per-step latency, tokens over time,
the KV/logit equality proof, time to first token against N with its fit, and the roofline.
Every number drawn comes from the results passed in (``experiments.parallel``, ``length_sweep``, ``roofline``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from prefillviz.analysis.machine_peaks import MachinePeaks
from prefillviz.analysis.roofline import RooflinePoint, roof
from prefillviz.experiments.kv_equality import EqualityCheck
from prefillviz.experiments.length_sweep import SweepResult
from prefillviz.experiments.parallel import ParallelComparison
from prefillviz.experiments.ways import PARALLEL, TOKEN_BY_TOKEN
from prefillviz.figures import style

WAY_COLORS = {PARALLEL: style.PREFILL, TOKEN_BY_TOKEN: style.DECODE}  # token-by-token runs like decode: 1 token a step
WAY_LABELS = {PARALLEL: "parallel (1 step of N tokens)", TOKEN_BY_TOKEN: "token-by-token (N steps of 1 token)"}


def _legend_below(fig: go.Figure, rows: int = 1) -> go.Figure:
    """Move the legend under the x axis, clear of long titles (``rows``: legend lines to make room for)."""
    fig.update_layout(
        legend={"orientation": "h", "yref": "container", "yanchor": "bottom", "y": 0.0, "xanchor": "left", "x": 0.0},
        margin={"b": 100 + 30 * rows},
        height=fig.layout.height + 30 * rows,
    )
    return fig


def step_latency_figure(comparison: ParallelComparison) -> go.Figure:
    """One bar per engine step (wall time, ms): 1 bar for parallel, N bars for token-by-token."""
    fig = go.Figure()
    for run in (comparison.parallel, comparison.token_by_token):
        steps = run.timing.steps
        fig.add_bar(
            x=[step.step_index + 1 for step in steps],
            y=[step.wall_time_s * 1e3 for step in steps],
            customdata=[[step.num_scheduled_tokens, step.forward_time_s * 1e3] for step in steps],
            hovertemplate="step %{x}: %{y:.1f} ms<br>%{customdata[0]} token(s), "
            "forward %{customdata[1]:.1f} ms<extra></extra>",
            name=f"{WAY_LABELS[run.way]}: {len(steps)} step(s)",
            marker_color=WAY_COLORS[run.way],
        )
    fig.update_layout(barmode="group", bargap=0.1)
    n = comparison.num_tokens
    style.apply_layout(
        fig, f"Per-step latency: 1 step of {n} tokens vs {n} steps of 1 token", "engine step", "step wall time (ms)"
    )
    return _legend_below(fig)


def tokens_over_time_figure(comparison: ParallelComparison) -> go.Figure:
    """Prompt tokens whose K/V are in the cache against time (ms) since the first step began."""
    fig = go.Figure()
    for run in (comparison.parallel, comparison.token_by_token):
        times_ms, tokens, done = [0.0], [0], 0
        for step in run.timing.steps:
            done += step.num_scheduled_tokens
            times_ms.append((step.start_time_s + step.wall_time_s) * 1e3)
            tokens.append(done)
        fig.add_scatter(
            x=times_ms, y=tokens, mode="lines+markers", line_shape="hv", name=WAY_LABELS[run.way],
            line={"color": WAY_COLORS[run.way], "width": 3}, marker={"size": 5},
        )
    style.apply_layout(
        fig, "Prompt tokens in the KV cache over time", "time since the first step (ms)", "prompt tokens processed"
    )
    return _legend_below(fig)


def kv_difference_figure(check: EqualityCheck) -> go.Figure:
    """Max |parallel - token-by-token| of the keys and values each layer wrote, over the layer's max |K| or |V|
    (log scale), and the tolerance: a few roundings of the dtype, the same on every CPU."""
    layers = list(range(check.num_layers))
    fig = go.Figure()
    for which, symbol, color in (("keys", "K", style.PREFILL), ("values", "V", style.ATTENTION)):
        fig.add_scatter(
            x=layers, y=check.relative_diffs(which), mode="lines+markers",
            name=f"{which}: max |Δ{symbol}| / max |{symbol}|", line={"color": color},
            hovertemplate=f"layer %{{x}}: %{{y:.2e}} of the layer's largest |{symbol}|<extra></extra>",
        )
    fig.add_scatter(
        x=[layers[0] - 0.5, layers[-1] + 0.5] if layers else [], y=[check.relative_tolerance] * (2 if layers else 0),
        mode="lines", name=f"tolerance {check.relative_tolerance:.1e} ({check.dtype}: a few roundings)",
        line={"color": style.EVICTED, "dash": "dash"},
    )
    fig.update_yaxes(type="log")
    fig.update_xaxes(dtick=1 if check.num_layers <= 12 else 5)
    exact = [i for i in layers if check.key_max_abs_diff[i] == 0 and check.value_max_abs_diff[i] == 0]
    title = f"KV cache, parallel vs token-by-token: largest difference per layer ({check.num_positions} positions)"
    if exact:
        title += f"<br><sup>layers {', '.join(map(str, exact))}: bit-identical (0 is off a log axis)</sup>"
    style.apply_layout(fig, title, "layer", "max |Δ| / the layer's max |K| or |V|")
    return _legend_below(fig)


def sweep_figure(sweep: SweepResult) -> go.Figure:
    """Measured time to first token against N, both ways, with the fitted t = a + bN + cN² (seconds)."""
    fig = go.Figure()
    for way, points in sweep.points.items():
        fit = sweep.fits[way]
        sizes = [p.num_tokens for p in points]
        fig.add_scatter(
            x=sizes, y=[p.time_to_first_token_s for p in points], mode="markers", name=f"{way}: measured",
            marker={"color": WAY_COLORS[way], "size": 11},
            customdata=[[p.num_steps] for p in points],
            hovertemplate="N=%{x}: %{y:.3f} s in %{customdata[0]} step(s)<extra></extra>",
        )
        grid = np.linspace(min(sizes), max(sizes), 60)
        fig.add_scatter(
            x=grid, y=fit.predict(grid), mode="lines", line={"color": WAY_COLORS[way], "dash": "dash"},
            name=f"{way} fit: {fit.a_s * 1e3:.3g} ms + {fit.b_s_per_token * 1e3:.3g} ms·N + "
            f"{fit.c_s_per_token2 * 1e6:.3g} µs·N²",
        )
    style.apply_layout(
        fig, "Time to first token against prompt length N", "prompt length N (tokens)", "time to first token (s)",
        height=460,
    )
    return _legend_below(fig, rows=2)


def roofline_figure(
    peaks: MachinePeaks, points: Sequence[RooflinePoint], prompt_points: Sequence[RooflinePoint] = ()
) -> go.Figure:
    """Log-log roofline: the measured roofs, and measured steps at their intensity and GFLOP/s."""
    everything = [*points, *prompt_points]
    intensities = [p.intensity for p in everything] + [peaks.ridge_intensity]
    low, high = min(intensities) / 3, max(intensities) * 3
    grid = list(np.geomspace(low, high, 200))
    fig = go.Figure()
    fig.add_scatter(
        x=grid, y=roof(peaks, grid), mode="lines", line={"color": style.NEUTRAL, "width": 3},
        name=f"roof: {peaks.memory_gb_s:,.1f} GB/s × intensity, capped at {peaks.matmul_gflops:,.0f} GFLOP/s",
    )
    groups = [
        ("prefill", "prefill steps (N tokens, 1 step)", style.PREFILL, "circle", points),
        ("decode", "decode steps (1 token, context C)", style.DECODE, "circle", points),
        (PARALLEL, "this prompt: parallel", style.PREFILL, "star", prompt_points),
        (TOKEN_BY_TOKEN, "this prompt: token-by-token", style.DECODE, "star", prompt_points),
    ]
    for phase, name, color, symbol, source in groups:
        chosen = [p for p in source if p.phase == phase]
        if not chosen:
            continue
        fig.add_scatter(
            x=[p.intensity for p in chosen], y=[p.achieved_gflops for p in chosen], mode="markers+text", name=name,
            text=[p.label.removeprefix("this prompt, ") for p in chosen],
            textposition="bottom center" if symbol == "star" else "top center",
            marker={
                "color": color, "size": 16 if symbol == "star" else 12, "symbol": symbol,
                "line": {"width": 1, "color": "black"},
            },
            customdata=[[p.measured_time_s * 1e3, p.flops / 1e9, p.bytes / 1e6] for p in chosen],
            hovertemplate="%{text}<br>%{x:.2f} FLOP/byte, %{y:.1f} GFLOP/s<br>"
            "forward %{customdata[0]:.2f} ms, %{customdata[1]:.3f} GFLOP, %{customdata[2]:.1f} MB<extra></extra>",
        )
    fig.add_scatter(
        x=[peaks.ridge_intensity], y=[peaks.matmul_gflops], mode="markers+text",
        marker={"color": style.NEUTRAL, "size": 10, "symbol": "diamond"},
        text=[f"ridge {peaks.ridge_intensity:.1f} FLOP/byte"], textposition="bottom right",
        name="ridge: memory roof meets compute roof",
    )
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    title = f"Roofline · {peaks.machine} · {peaks.device}, {peaks.dtype}, {peaks.num_threads} threads"
    style.apply_layout(fig, title, "arithmetic intensity (FLOP/byte)", "achieved throughput (GFLOP/s)", height=520)
    return _legend_below(fig, rows=3)


def engines_ttft_figure(runs) -> go.Figure:
    """Grouped bars per way: time to first token on our engine and on vLLM (median ms, spread in the hover).

    ``runs``: ``peers.side_by_side.PeerRun`` per way, labelled with the way.
    """
    fig = go.Figure()
    for name, attribute, color in (("ours", "ours_ttft_s", style.PREFILL), ("vLLM", "theirs_ttft_s", style.DECODE)):
        times = [getattr(run, attribute) for run in runs]
        medians = [float(np.median(t)) * 1e3 for t in times]
        fig.add_bar(
            x=[WAY_LABELS.get(run.label, run.label) for run in runs], y=medians, name=name, marker_color=color,
            text=[f"{m:,.0f}" for m in medians], textposition="outside",
            hovertext=[f"{len(t)} run(s), {min(t) * 1e3:,.1f}-{max(t) * 1e3:,.1f} ms" for t in times],
        )
    fig.update_layout(barmode="group")
    return style.apply_layout(
        fig, "Time to first token: our engine and vLLM, the same prompt both ways", "", "time to first token (ms)"
    )
