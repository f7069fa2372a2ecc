"""Figures of chunked prefill: the per-step timeline (a Gantt of who ran what in which step),
the latencies users feel, and the token-budget trade-off. Every number drawn comes from the
traces passed in."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from prefillviz.engine.trace import Trace
from prefillviz.experiments.budget_sweep import BudgetSweep
from prefillviz.experiments.chunked import LONG_REQUEST_ID, LatencySummary
from prefillviz.figures import style


def timeline_figure(trace: Trace, title: str, x_axis: str = "time", x_max: float | None = None) -> go.Figure:
    """A Gantt of the run: one row per request, one bar per (step, request) chunk.

    A bar spans its step (all chunks of a step run in one forward pass), blue for prefill
    tokens and orange for decode tokens; prefill bars are labelled with their token count.

    Args:
        trace: a run of the chunked workload.
        x_axis: "time" (ms since the first step, from each step's start and wall time) or "step".
        x_max: the right end of the x axis, to line up two runs.
    """
    request_ids = list(trace.requests)
    bars: dict[bool, dict[str, list]] = {
        kind: {"y": [], "base": [], "x": [], "text": [], "hover": []} for kind in (True, False)
    }
    for step in trace.steps:
        if x_axis == "time":
            base, width = step.start_time_s * 1000, step.wall_time_s * 1000
        else:
            base, width = step.step_index - 0.45, 0.9
        for chunk in step.chunks:
            bar = bars[chunk.is_prefill]
            kind = "prefill" if chunk.is_prefill else "decode"
            bar["y"].append(chunk.request_id)
            bar["base"].append(base)
            bar["x"].append(width)
            bar["text"].append(str(chunk.num_tokens) if chunk.is_prefill else "")
            bar["hover"].append(
                f"step {step.step_index} · {chunk.request_id}<br>{kind}: {chunk.num_tokens} token(s), positions "
                f"{chunk.start_position}–{chunk.start_position + chunk.num_tokens - 1}<br>"
                f"step: {step.num_scheduled_tokens} tokens in {step.wall_time_s * 1000:,.1f} ms"
            )
    fig = go.Figure()
    for is_prefill, name, color in [(True, "prefill tokens", style.PREFILL), (False, "decode token", style.DECODE)]:
        bar = bars[is_prefill]
        fig.add_bar(
            y=bar["y"], base=bar["base"], x=bar["x"], text=bar["text"], hovertext=bar["hover"], hoverinfo="text",
            orientation="h", name=name, marker={"color": color, "line": {"color": "white", "width": 1}},
            textposition="inside", insidetextanchor="middle",
        )
    long = trace.requests.get(LONG_REQUEST_ID)
    if long is not None:
        if x_axis == "time":
            arrival = long.arrival_time_s * 1000
        else:
            arrival = next(
                (s.step_index for s in trace.steps if s.start_time_s >= long.arrival_time_s), trace.num_steps
            ) - 0.5
        fig.add_vline(x=arrival, line={"color": style.NEUTRAL, "dash": "dash", "width": 2})
        fig.add_annotation(
            x=arrival, y=1.0, yref="paper", text="long prompt arrives", showarrow=False,
            xanchor="left", yanchor="bottom",
        )
    fig.update_layout(barmode="overlay", bargap=0.25)
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(request_ids)))
    if x_max is not None:
        fig.update_xaxes(range=[0, x_max] if x_axis == "time" else [-0.6, x_max])
    x_title = "time since the first step (ms)" if x_axis == "time" else "engine step (index)"
    return style.apply_layout(fig, title, x_title, "request", height=max(260, 70 * len(request_ids) + 140))


LATENCY_METRICS = [
    ("itl_p50_ms", "ITL p50"),
    ("itl_p99_ms", "ITL p99"),
    ("itl_max_ms", "ITL max"),
    ("long_ttft_ms", "TTFT of the long prompt"),
]
RUN_COLORS = {"chunking off": style.NEUTRAL, "chunking on": style.PREFILL}


def latency_rows(summaries: dict[str, LatencySummary]) -> list[dict]:
    """One row per run: the latencies (ms) and step counts, for tables and downloads."""
    return [
        {
            "run": label,
            "ITL p50 (ms)": s.itl_p50_ms,
            "ITL p99 (ms)": s.itl_p99_ms,
            "ITL max (ms)": s.itl_max_ms,
            "TTFT long (ms)": s.long_ttft_ms,
            "steps": s.num_steps,
            "steps that paused a decode": s.num_paused_decode_steps,
            "total (ms)": s.total_ms,
        }
        for label, s in summaries.items()
    ]


def latency_figure(summaries: dict[str, LatencySummary], title: str) -> go.Figure:
    """Grouped bars: ITL p50 / p99 / max of the decoding requests and TTFT of the long prompt, per run (ms)."""
    fig = go.Figure()
    labels = [label for _, label in LATENCY_METRICS]
    for i, (run, summary) in enumerate(summaries.items()):
        values = [getattr(summary, key) for key, _ in LATENCY_METRICS]
        fig.add_bar(
            x=labels, y=values, name=run, marker_color=RUN_COLORS.get(run, style.SEQUENCE[i % len(style.SEQUENCE)]),
            text=[f"{v:,.0f}" if not math.isnan(v) else "" for v in values], textposition="outside",
        )
    fig.update_layout(barmode="group")
    return style.apply_layout(fig, title, "latency", "time (ms)")


def sweep_rows(sweep: BudgetSweep) -> list[dict]:
    return [
        {
            "run": "chunking off" if not p.enable_chunked_prefill else f"chunked, budget {p.token_budget}",
            "token budget": p.token_budget,
            "chunked prefill": p.enable_chunked_prefill,
            "TTFT long (ms)": p.summary.long_ttft_ms,
            "ITL max (ms)": p.summary.itl_max_ms,
            "ITL p99 (ms)": p.summary.itl_p99_ms,
            "ITL p50 (ms)": p.summary.itl_p50_ms,
            "steps": p.summary.num_steps,
            "outputs equal chunking off": p.outputs_match_off,
        }
        for p in sweep.points
    ]


def sweep_figure(sweep: BudgetSweep, title: str) -> go.Figure:
    """The trade-off: max ITL of the decoding requests against TTFT of the long prompt, one point per budget."""
    chunked = [p for p in sweep.points if p.enable_chunked_prefill]
    off = [p for p in sweep.points if not p.enable_chunked_prefill]
    fig = go.Figure()
    fig.add_scatter(
        x=[p.summary.long_ttft_ms for p in chunked], y=[p.summary.itl_max_ms for p in chunked],
        mode="lines+markers+text", text=[f"budget {p.token_budget}" for p in chunked], textposition="top center",
        name="chunking on (one point per token budget)", marker={"color": style.PREFILL, "size": 12},
        line={"color": style.PREFILL},
    )
    fig.add_scatter(
        x=[p.summary.long_ttft_ms for p in off], y=[p.summary.itl_max_ms for p in off], mode="markers+text",
        text=["chunking off"] * len(off), textposition="bottom center", name="chunking off",
        marker={"color": style.NEUTRAL, "size": 16, "symbol": "x"},
    )
    xs = [p.summary.long_ttft_ms for p in sweep.points if not math.isnan(p.summary.long_ttft_ms)]
    ys = [p.summary.itl_max_ms for p in sweep.points if not math.isnan(p.summary.itl_max_ms)]
    if xs and ys:  # room for the labels around the outermost points
        fig.update_xaxes(range=[min(xs) - 0.15 * (max(xs) - min(xs)) - 1, max(xs) + 0.15 * (max(xs) - min(xs)) + 1])
        fig.update_yaxes(range=[0, max(ys) * 1.2 + 1])
    return style.apply_layout(
        fig, title, "TTFT of the long prompt (ms)", "max ITL of the decoding requests (ms)", height=480
    )
