"""Figures of prefix caching: each request's blocks (hit / computed / partial), the hit rate
over the stream from vLLM's counters, TTFT with and without hits, and evictions in a small
cache. Every number drawn comes from the runs passed in."""

from __future__ import annotations

from collections.abc import Callable

import plotly.graph_objects as go

from prefillviz.engine.trace import Trace
from prefillviz.experiments.prefix import PrefixExperiment, RequestBlocks, StreamRun
from prefillviz.figures import style

BLOCK_STATUSES = [
    ("hit", "cache hit (K/V reused)", style.CACHE_HIT),
    ("computed", "computed (full block, cached after)", style.PREFILL),
    ("partial", "partial (prompt ends inside it)", style.PARTIAL),
]


def block_grid_figure(
    blocks: list[RequestBlocks], block_size: int, title: str, token_text: Callable[[str, int], str] | None = None
) -> go.Figure:
    """One row per request, one cell per prompt block, coloured by what prefix caching did with it.

    Args:
        blocks: ``StreamRun.request_blocks`` of each request, in arrival order.
        token_text: (request id, block index) -> the block's text, for the hover.
    """
    fig = go.Figure()
    for status, name, color in BLOCK_STATUSES:
        y, base, text, hover = [], [], [], []
        for request in blocks:
            for i, (cell, physical) in enumerate(zip(request.statuses, request.physical_blocks)):
                if cell != status:
                    continue
                y.append(request.request_id)
                base.append(i)
                text.append(str(physical))
                first, last = i * block_size, min((i + 1) * block_size, request.num_prompt_tokens) - 1
                words = f"<br>{token_text(request.request_id, i)}" if token_text else ""
                hover.append(
                    f"{request.request_id} · block {i} (tokens {first}–{last}) · physical block {physical}"
                    f"<br>{name}{words}"
                )
        fig.add_bar(
            y=y, base=base, x=[1] * len(y), text=text, hovertext=hover, hoverinfo="text", orientation="h", name=name,
            marker={"color": color, "line": {"color": "white", "width": 2}}, textposition="inside",
            insidetextanchor="middle",
        )
    fig.update_layout(barmode="overlay", bargap=0.15)
    fig.update_yaxes(categoryorder="array", categoryarray=[b.request_id for b in reversed(blocks)])
    return style.apply_layout(
        fig, title, f"logical block of the prompt ({block_size} tokens each; label = physical block id)", "request",
        height=max(260, 55 * len(blocks) + 150),
    )


def hit_rate_rows(run: StreamRun) -> list[dict]:
    """Per request: tokens looked up and found, and vLLM's cumulative counters after it."""
    rows, previous = [], (0, 0)
    for request_id, (queries, hits) in zip(run.request_steps, run.counters):
        rows.append(
            {
                "request": request_id,
                "queried tokens": queries - previous[0],
                "hit tokens": hits - previous[1],
                "prefix_cache_queries (cumulative)": queries,
                "prefix_cache_hits (cumulative)": hits,
                "hit rate (cumulative, %)": 100 * hits / queries if queries else 0.0,
            }
        )
        previous = (queries, hits)
    return rows


def hit_rate_figure(run: StreamRun, title: str) -> go.Figure:
    """Bars: tokens each request looked up and found; line: cumulative hits / queries (%)."""
    rows = hit_rate_rows(run)
    requests = [row["request"] for row in rows]
    fig = go.Figure()
    fig.add_bar(
        x=requests, y=[r["queried tokens"] for r in rows], name="queried (prompt tokens)", marker_color=style.FREE
    )
    fig.add_bar(
        x=requests, y=[r["hit tokens"] for r in rows], name="hit (found in the cache)", marker_color=style.CACHE_HIT
    )
    fig.add_scatter(
        x=requests, y=[r["hit rate (cumulative, %)"] for r in rows], yaxis="y2", mode="lines+markers+text",
        text=[f"{r['hit rate (cumulative, %)']:.0f}%" for r in rows], textposition="top center",
        name="prefix_cache_hits / prefix_cache_queries (cumulative)", line={"color": style.NEUTRAL, "width": 3},
    )
    fig.update_layout(barmode="group", yaxis2={"overlaying": "y", "side": "right"})
    style.apply_layout(fig, title, "request (in arrival order)", "tokens (count)")
    fig.update_layout(  # after apply_layout, which titles every y axis alike
        yaxis2={
            "title": {"text": "cumulative hit rate (%)"}, "range": [0, 105], "tickvals": [0, 25, 50, 75, 100],
            "showgrid": False,
        }
    )
    return fig


RUN_COLORS = {"cache on": style.CACHE_HIT, "cache off": style.PREFILL, "small cache": style.EVICTED}


def ttft_rows(experiment: PrefixExperiment) -> list[dict]:
    rows = []
    for request_id in experiment.stream.request_ids:
        row = {"request": request_id}
        for run in experiment.runs:
            record = run.trace.requests[request_id]
            row[f"TTFT {run.label} (ms)"] = record.time_to_first_token_s * 1000
            row[f"cached tokens, {run.label}"] = record.num_cached_tokens
        rows.append(row)
    return rows


def ttft_figure(experiment: PrefixExperiment, title: str) -> go.Figure:
    """Grouped bars per request: time to first token in each run (ms), hit tokens in the hover."""
    fig = go.Figure()
    requests = experiment.stream.request_ids
    for run in experiment.runs:
        records = [run.trace.requests[rid] for rid in requests]
        fig.add_bar(
            x=requests, y=[r.time_to_first_token_s * 1000 for r in records], name=run.label,
            marker_color=RUN_COLORS.get(run.label, style.NEUTRAL),
            hovertext=[f"{r.num_cached_tokens} of {r.num_prompt_tokens} prompt tokens from the cache" for r in records],
            text=[f"{r.time_to_first_token_s * 1000:,.0f}" for r in records], textposition="outside",
        )
    fig.update_layout(barmode="group")
    return style.apply_layout(fig, title, "request (in arrival order)", "time to first token (ms)")


def eviction_rows(run: StreamRun) -> list[dict]:
    return [
        {"step": index, "request": request_id, "evicted blocks": len(evicted),
         "evicted block ids": " ".join(map(str, evicted)), "free blocks after": run.trace.steps[index].num_free_blocks}
        for index, request_id, evicted in run.evictions()
    ]


def eviction_figure(run: StreamRun, title: str) -> go.Figure:
    """Bars: cached blocks evicted in each step (reused for new K/V); line: free blocks after the step."""
    rows = eviction_rows(run)
    fig = go.Figure()
    fig.add_bar(
        x=[r["step"] for r in rows], y=[r["evicted blocks"] for r in rows], name="evicted cached blocks",
        marker_color=style.EVICTED,
        hovertext=[f"step {r['step']} ({r['request']})<br>evicted: {r['evicted block ids'] or 'none'}" for r in rows],
        hoverinfo="text",
    )
    fig.add_scatter(
        x=[r["step"] for r in rows], y=[r["free blocks after"] for r in rows], mode="markers+lines",
        name="free blocks after the step",
        line={"color": style.NEUTRAL, "dash": "dot", "width": 1}, marker={"size": 5},
    )
    for request_id, indices in run.request_steps.items():
        if indices:
            fig.add_vline(x=indices[0] - 0.5, line={"color": style.FREE, "width": 2, "dash": "dash"})
            fig.add_annotation(
                x=indices[0] - 0.5, y=1.0, yref="paper", text=request_id, showarrow=False,
                xanchor="left", yanchor="bottom",
            )
    fig.update_yaxes(range=[0, run.num_blocks + 0.5])
    return style.apply_layout(fig, title, "engine step (index)", "blocks (count)")


def cached_tokens_figure(ours: Trace, theirs: Trace, title: str) -> go.Figure:
    """Grouped bars per request: prompt tokens served from the prefix cache, our engine and vLLM."""
    fig = go.Figure()
    requests = list(ours.requests)
    for name, trace, color in (("ours", ours, style.CACHE_HIT), ("vLLM", theirs, style.DECODE)):
        cached = [trace.requests[rid].num_cached_tokens for rid in requests]
        fig.add_bar(
            x=requests, y=cached, name=name, marker_color=color, text=[str(c) for c in cached], textposition="outside"
        )
    fig.update_layout(barmode="group")
    return style.apply_layout(fig, title, "request (in arrival order)", "prompt tokens from the cache")
