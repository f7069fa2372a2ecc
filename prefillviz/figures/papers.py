"""The papers' figures re-plotted from their published numbers (``experiments.papers_published``),
with ours drawn over them. Where the absolute scales differ (a 34B model on A100s against a 135M
model on this machine) both are shown as ratios or normalised, and the axis title says so.

    paper's curves   dashed, grey-ish, hollow markers, named by the paper
    ours             solid, in the app's colours
    vLLM             dotted
"""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.disagg.experiment import SETUPS
from prefillviz.experiments import papers_published as published
from prefillviz.figures import style

PAPER_DASH, PEER_DASH = "dash", "dot"
PAPER_COLORS = ["#555555", "#8c8c8c", "#b0b0b0", "#3b3b3b"]
SETUP_COLORS = dict(zip(SETUPS, (style.NEUTRAL, style.PREFILL, style.CACHE_HIT)))


def _legend_beside(fig: go.Figure) -> go.Figure:
    """A long legend to the right of the plot, not over its title."""
    return fig.update_layout(legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top"})


def _paper_line(fig: go.Figure, x, y, name: str, color: str, hover: str = "") -> None:
    fig.add_scatter(x=x, y=y, mode="lines+markers", name=name, line={"color": color, "dash": PAPER_DASH},
                    marker={"symbol": "circle-open", "size": 9}, hovertext=hover or None)


def piggyback_figure(result, title: str) -> go.Figure:
    """Table 2: time per token of each batch, relative to the prefill-only batch's (log scale)."""
    paper = published.piggyback_rows()
    p_prefill = next(r for r in paper if not r["decode_tokens"])["per_token_ms"]
    kinds = ["decode-only", "prefill alone", "mixed (prefill + decodes)"]
    paper_by_kind = {
        "decode-only": next(r for r in paper if not r["prefill_tokens"])["per_token_ms"],
        "prefill alone": p_prefill,
        "mixed (prefill + decodes)": next(
            r for r in paper if r["prefill_tokens"] and r["decode_tokens"]
        )["per_token_ms"],
    }
    ours = [result.decode_only_per_token_ms, result.prefill_alone_per_token_ms, result.mixed_per_token_ms]
    fig = go.Figure()
    source = published.SOURCES["piggyback"]
    fig.add_bar(x=kinds, y=[paper_by_kind[k] / p_prefill for k in kinds],
                name=f"{source.figure} ({source.model}, C=1,024)", marker={"color": "#b0b0b0"},
                text=[f"{paper_by_kind[k] / p_prefill:,.1f}×" for k in kinds], textposition="outside")
    fig.add_bar(x=kinds, y=[v / result.prefill_alone_per_token_ms for v in ours],
                name=f"ours ({result.dtype}, C={result.chunk_tokens:,})",
                marker={"color": [style.DECODE, style.PREFILL, style.CACHE_HIT]},
                text=[f"{v / result.prefill_alone_per_token_ms:,.1f}× ({v:,.2f} ms)" for v in ours],
                textposition="outside")
    fig.update_layout(barmode="group")
    fig.update_yaxes(type="log")
    return style.apply_layout(fig, title, "batch", "time per token ÷ prefill-alone's (log)")


def chunk_cost_figure(result, title: str) -> go.Figure:
    """Figure 9a: prefill time in chunks over the whole prefill's, against the chunk size."""
    fig = go.Figure()
    paper = published.chunk_cost_rows()
    source = published.SOURCES["chunk_cost"]
    for i, n in enumerate(sorted({r["prefill_tokens"] for r in paper})):
        rows = [r for r in paper if r["prefill_tokens"] == n and r["chunk_size"] < n]
        _paper_line(
            fig, [r["chunk_size"] for r in rows], [r["relative"] for r in rows], f"{source.figure}, N={n + 1:,}",
            PAPER_COLORS[i % 4],
        )
    for i, n in enumerate(sorted({p.prompt_tokens for p in result.points})):
        points = [p for p in result.points if p.prompt_tokens == n and p.chunk_size]
        fig.add_scatter(
            x=[p.chunk_size for p in points], y=[p.overhead for p in points], mode="lines+markers",
            name=f"ours, N={n:,}", line={"color": style.SEQUENCE[i % len(style.SEQUENCE)], "width": 3},
            marker={"size": 10},
            hovertext=[
                f"{p.num_steps} steps, {p.time_to_first_token_ms:,.0f} ms "
                f"(whole: {p.time_to_first_token_ms / p.overhead:,.0f} ms)"
                for p in points
            ],
        )
    fig.add_hline(y=1.0, line={"color": style.NEUTRAL, "dash": "dot"}, annotation_text="whole prefill")
    fig.update_xaxes(
        type="log", tickvals=sorted({p.chunk_size for p in result.points if p.chunk_size} | {512, 1024, 2048})
    )
    return _legend_beside(
        style.apply_layout(fig, title, "chunk size (tokens, log)", "prefill time ÷ whole prefill's", height=480)
    )


def knee_figure(result, vllm_result=None, title: str = "") -> go.Figure:
    """TTFT against N with the hinge fit, its knee, and the roofline's ridge in tokens (ms)."""
    fig = go.Figure()
    for run, name, dash, color in ((result, "ours", "solid", style.PREFILL),
                                   (vllm_result, "vLLM", PEER_DASH, style.DECODE)):
        if run is None:
            continue
        fig.add_scatter(x=run.sizes, y=run.ttft_ms, mode="markers", name=f"{name}: TTFT (median)",
                        marker={"color": color, "size": 10})
        fitted_x = sorted(set(run.sizes) | {run.fit.knee_tokens})
        fig.add_scatter(x=fitted_x, y=list(run.fit.predict(fitted_x)), mode="lines",
                        name=f"{name}: flat, then rising (fit)", line={"color": color, "dash": dash})
        _vertical(
            fig, run.fit.knee_tokens, f"{name}: knee ≈ {run.fit.knee_tokens:,.0f}", color, dash, result, vllm_result
        )
    if result.ridge_tokens is not None:
        _vertical(
            fig, result.ridge_tokens, f"roofline ridge: N ≈ {result.ridge_tokens:,}", style.CACHE_HIT, "solid",
            result, vllm_result,
        )
    fig.update_xaxes(type="log")
    return style.apply_layout(fig, title, "prompt tokens N (log)", "time to first token (ms)")


def _vertical(fig: go.Figure, x: float, name: str, color: str, dash: str, *runs) -> None:
    """A vertical line at ``x`` as a named trace (a shape's annotation lands at 10^x on a log axis)."""
    times = [t for run in runs if run is not None for t in run.ttft_ms]
    fig.add_scatter(
        x=[x, x], y=[0, max(times)], mode="lines", name=name, line={"color": color, "dash": dash, "width": 2}
    )


def knee_per_token_figure(result, vllm_result=None, title: str = "") -> go.Figure:
    """Sarathi-Serve Figure 2's view: time per prompt token, over its smallest value, against N."""
    fig = go.Figure()
    paper = published.knee_rows()
    low = min(r["per_token_ms"] for r in paper)
    source = published.SOURCES["knee"]
    _paper_line(
        fig, [r["prefill_tokens"] for r in paper], [r["per_token_ms"] / low for r in paper],
        f"{source.figure} ({source.model})", PAPER_COLORS[0],
    )
    for run, name, dash, color in ((result, "ours", "solid", style.PREFILL),
                                   (vllm_result, "vLLM", PEER_DASH, style.DECODE)):
        if run is None:
            continue
        per_token = [t / n for n, t in zip(run.sizes, run.ttft_ms)]
        fig.add_scatter(x=run.sizes, y=[v / min(per_token) for v in per_token], mode="lines+markers", name=name,
                        line={"color": color, "dash": dash})
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return style.apply_layout(fig, title, "prompt tokens N (log)", "time per prompt token ÷ its lowest (log)")


def block_hits_figure(results: list, title: str) -> go.Figure:
    """Share of the shared prefix served from the cache against its length, one line per engine and block size."""
    fig = go.Figure()
    i = 0
    for result in results:
        dash = "solid" if result.engine == "ours" else PEER_DASH
        for block_size in sorted({p.block_size for p in result.points}):
            points = sorted((p for p in result.points if p.block_size == block_size), key=lambda p: p.prefix_tokens)
            fig.add_scatter(
                x=[p.prefix_tokens for p in points], y=[p.hit_percent for p in points], mode="lines+markers",
                line={"shape": "linear", "dash": dash, "color": style.SEQUENCE[i % len(style.SEQUENCE)]},
                name=f"{result.engine}, block {block_size}",
                hovertext=[f"{p.cached_tokens} of {p.prefix_tokens} shared tokens from the cache" for p in points],
            )
            i += 1
    return style.apply_layout(fig, title, "shared prefix (tokens)", "of the shared prefix from the cache (%)")


def long_output_figure(saving, title: str) -> go.Figure:
    """The share of a request's time a prefix hit saved, had it stopped after k tokens."""
    curve = saving.curve()
    fig = go.Figure()
    fig.add_scatter(x=[r["output_tokens"] for r in curve], y=[r["saved_percent"] for r in curve], mode="lines+markers",
                    line={"color": style.CACHE_HIT, "width": 3}, name="time saved by the hit")
    fig.add_hline(y=saving.ttft_saved_percent, line={"color": style.PREFILL, "dash": "dot"},
                  annotation_text=f"TTFT saved: {saving.ttft_saved_percent:.0f}%")
    return style.apply_layout(fig, title, "tokens generated", "request time saved by the hit (%)")


def interference_figure(sweep, title: str) -> go.Figure:
    """The decoding users' worst gap over their median gap, per set-up, against the long prompt's
    length; DistServe's fitted colocated model (a step carrying the prefill over a decode step) dashed."""
    fig = go.Figure()
    sizes = [p.long_prompt_tokens for p in sweep.points]
    first = sweep.points[0].comparison.workload
    model = published.distserve_interference(
        sizes, len(first.short_prompts), len(first.short_prompts[0]) + first.short_max_new_tokens // 2
    )
    _paper_line(
        fig, sizes, [r["ratio"] for r in model], "DistServe's model, colocated (OPT-13B, A100)", PAPER_COLORS[0]
    )
    for setup in SETUPS:
        fig.add_scatter(x=sizes, y=[p.interference(setup) for p in sweep.points], mode="lines+markers",
                        name=f"ours: {setup}", line={"color": SETUP_COLORS[setup], "width": 3}, marker={"size": 10})
    fig.add_hline(y=1.0, line={"color": style.NEUTRAL, "dash": "dot"})
    return _legend_beside(style.apply_layout(fig, title, "long prompt (tokens)", "worst gap ÷ median gap (×)"))


def worst_gap_figure(sweep, title: str) -> go.Figure:
    """Each set-up's worst gap (ms) against the long prompt's length, with the crossover marked."""
    fig = go.Figure()
    sizes = [p.long_prompt_tokens for p in sweep.points]
    for setup in SETUPS:
        fig.add_scatter(x=sizes, y=[p.worst_gap_ms(setup) for p in sweep.points], mode="lines+markers", name=setup,
                        line={"color": SETUP_COLORS[setup], "width": 3}, marker={"size": 10})
    crossover = sweep.crossover()
    if crossover is not None:
        fig.add_vline(x=crossover, line={"color": style.CACHE_HIT, "dash": "dash"},
                      annotation_text=f"disaggregated beats chunking off from N={crossover:,}")
    return style.apply_layout(fig, title, "long prompt (tokens)", "decoding users' worst gap (ms)")
