"""Figures of a probed server ("Your server"), in the local pages' colours and units."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from prefillviz.figures import style
from prefillviz.probe.report import ProbeReport

SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x", "star")


def ttft_figure(report: ProbeReport) -> go.Figure:
    """Time to first token against N: every run, their medians and the fitted a + bN + cN²."""
    fig = go.Figure()
    points = report.ttft
    fig.add_scatter(
        x=[p.num_tokens for p in points for _ in p.runs], y=[t * 1e3 for p in points for t in p.runs], mode="markers",
        name="each run", marker={"color": style.PARTIAL, "size": 8}, hovertemplate="N=%{x}: %{y:.1f} ms<extra></extra>",
    )
    fig.add_scatter(
        x=[p.num_tokens for p in points], y=[p.ttft_s_median * 1e3 for p in points], mode="markers", name="median",
        marker={"color": style.PREFILL, "size": 12}, hovertemplate="N=%{x}: median %{y:.1f} ms<extra></extra>",
    )
    fit = report.ttft_fit
    if fit is not None:
        grid = np.linspace(min(p.num_tokens for p in points), max(p.num_tokens for p in points), 60)
        fig.add_scatter(
            x=grid, y=fit.predict(grid) * 1e3, mode="lines", line={"color": style.PREFILL, "dash": "dash"},
            name=f"fit: {fit.a_s * 1e3:.3g} ms + {fit.b_s_per_token * 1e3:.3g} ms·N + "
            f"{fit.c_s_per_token2 * 1e6:.3g} µs·N²",
        )
    title = f"Time to first token against prompt length N ({report.server['model']})"
    return style.apply_layout(
        fig, title, "prompt length N (tokens, the server's count)", "time to first token (ms)", height=460
    )


def prefix_figure(report: ProbeReport) -> go.Figure:
    """The same prefix twice: the first request (a miss) and the second (a hit), median ms and each run."""
    prefix = report.prefix
    fig = go.Figure()
    for label, runs, color in (("first: a miss", prefix.miss_runs_s, style.PREFILL),
                               ("second: a hit", prefix.hit_runs_s, style.CACHE_HIT)):
        median = float(np.median(runs)) * 1e3
        fig.add_bar(x=[label], y=[median], marker_color=color, name=label, text=[f"{median:,.0f} ms"],
                    textposition="outside",
                    hovertext=[f"{len(runs)} run(s): " + ", ".join(f"{t * 1e3:,.0f}" for t in runs) + " ms"])
    cached = prefix.cached_tokens_reported
    told = (f"the server says {cached} of {prefix.prompt_tokens} prompt tokens came from its cache"
            if cached is not None else "the server reports no cached-token count")
    title = (f"A {prefix.prefix_tokens}-token prefix sent twice: {prefix.speedup:.1f}× faster the second time"
             f"<br><sup>{told}</sup>")
    fig.update_layout(showlegend=False)
    return style.apply_layout(fig, title, "", "time to first token (ms)")


def interference_figure(report: ProbeReport) -> go.Figure:
    """Each stream's inter-token gaps over time, with the long prompt's prefill as a band."""
    result = report.interference
    fig = go.Figure()
    for index, times in enumerate(result.stream_token_times_s):
        gaps = [(b, (b - a) * 1e3) for a, b in zip(times, times[1:])]
        # one marker per token, at its arrival, as high as the wait before it (no line: a gap is not a ramp)
        fig.add_scatter(
            x=[t for t, _ in gaps], y=[g for _, g in gaps], mode="markers", name=f"stream {index + 1}",
            marker={
                "color": style.SEQUENCE[(index + 1) % len(style.SEQUENCE)], "size": 10,
                "symbol": SYMBOLS[index % len(SYMBOLS)],
            },
            hovertemplate="token at %{x:.2f} s, %{y:.1f} ms after the one before<extra></extra>",
        )
    fig.add_vrect(
        x0=result.long_sent_s, x1=result.long_first_token_s, fillcolor=style.PREFILL, opacity=0.15, line_width=0,
        annotation_text=f"{result.long_prompt_tokens}-token prompt: sent → first token", annotation_position="top left",
    )
    title = (f"Inter-token gaps of {len(result.stream_token_times_s)} streams while a long prompt arrives: "
             f"worst {result.itl_max_ms(False):,.0f} ms before, {result.itl_max_ms(True):,.0f} ms during")
    return style.apply_layout(
        fig, title, "time since the first stream was sent (s)", "gap before this token (ms)", height=460
    )
