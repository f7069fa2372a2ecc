"""Figures of the Long prompts page: the O(N^2) wall, kept tiles over the real attention, the trade-off.

Pure functions of ``experiments.long_prompt_wall.WallResult``, ``experiments.sparse_maps.BlockMaps`` and
``experiments.sparse_prefill.SparseComparison`` lists: no streamlit, no model.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from prefillviz.figures import style


def wall_figure(result) -> go.Figure:
    """Per N, the prefill's seconds split into attention, linears and the rest (stacked)."""
    labels = [f"{p.num_tokens:,}" for p in result.points]
    fig = go.Figure()
    for name, values, colour in (
        ("attention (QK^T, softmax, PV)", [p.attention_s for p in result.points], style.ATTENTION),
        ("linears (q|k|v, o, MLP, lm_head)", [p.linears_s for p in result.points], style.MLP),
        ("the rest (norms, RoPE, K/V write, Python)", [p.rest_s for p in result.points], style.OTHER),
    ):
        fig.add_bar(x=labels, y=values, name=name, marker_color=colour)
    fig.update_layout(barmode="stack")
    return style.apply_layout(fig, "Where the time to first token goes, by prompt length", "prompt tokens N",
                              "seconds")


def share_figure(result) -> go.Figure:
    """Attention's and the linears' seconds per N (log-log), with the measured and FLOP-model crossovers."""
    n = [p.num_tokens for p in result.points]
    fig = go.Figure()
    fig.add_scatter(x=n, y=[p.attention_s for p in result.points], mode="lines+markers", name="attention",
                    line_color=style.ATTENTION)
    fig.add_scatter(x=n, y=[p.linears_s for p in result.points], mode="lines+markers", name="linears",
                    line_color=style.MLP)
    for x, text, dash in ((result.measured_crossover_tokens, "measured crossover", "solid"),
                          (result.flop_crossover_tokens, "FLOP model's crossover", "dash")):
        if x:
            fig.add_vline(x=x, line_dash=dash, line_color=style.NEUTRAL, annotation_text=f"{text}: {x:,.0f}")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return style.apply_layout(fig, "Attention against the linears", "prompt tokens N (log)", "seconds (log)")


def per_layer_figure(point) -> go.Figure:
    """One size's attention and linears seconds in each decoder layer."""
    layers = list(range(len(point.attention_per_layer_s)))
    fig = go.Figure()
    for name, values, colour in (("attention", point.attention_per_layer_s, style.ATTENTION),
                                 ("linears", point.linears_per_layer_s, style.MLP)):
        fig.add_bar(x=layers, y=[t * 1e3 for t in values], name=name, marker_color=colour)
    return style.apply_layout(fig, f"Per layer at N = {point.num_tokens:,} (the last layer attends for one row only)",
                              "decoder layer", "ms")


def ttft_fit_figure(result) -> go.Figure:
    """Measured TTFT, the fit a + bN + cN^2, and its N and N^2 terms drawn apart."""
    fit = result.ttft_fit
    n = np.array([p.num_tokens for p in result.points], dtype=float)
    grid = np.linspace(0, n.max(), 100)
    fig = go.Figure()
    fig.add_scatter(x=n, y=[p.ttft_s for p in result.points], mode="markers", name="measured", marker_size=11,
                    marker_color=style.PREFILL)
    fig.add_scatter(x=grid, y=fit.predict(grid), name=f"fit (R² {fit.r_squared:.3f})", line_color=style.PREFILL)
    fig.add_scatter(x=grid, y=fit.b_s_per_token * grid, name="b·N (per token: linears)", line_dash="dash",
                    line_color=style.MLP)
    fig.add_scatter(x=grid, y=fit.c_s_per_token2 * grid**2, name="c·N² (attention's pairs)", line_dash="dot",
                    line_color=style.ATTENTION)
    return style.apply_layout(fig, "Time to first token: the N and N² terms apart", "prompt tokens N", "seconds")


def kept_blocks_figure(maps, heads: int | None = None) -> go.Figure:
    """Per head: the real tile attention (log10 share) with the tiles block-sparse prefill keeps marked."""
    num_heads = maps.real.shape[0] if heads is None else min(heads, maps.real.shape[0])
    cols = 3
    rows = math.ceil(num_heads / cols)
    mass = maps.mass_kept_per_head()
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"head {h}: {mass[h]:.0%} of its attention kept"
                                                              for h in range(num_heads)],
                        horizontal_spacing=0.04, vertical_spacing=0.08)
    nb = maps.real.shape[-1]
    causal = np.tril(np.ones((nb, nb), dtype=bool))
    for h in range(num_heads):
        row, col = h // cols + 1, h % cols + 1
        shown = np.where(causal, np.log10(np.maximum(maps.real[h], 1e-6)), np.nan)
        fig.add_heatmap(z=shown, colorscale=style.HEATMAP_SCALE, zmin=-4, zmax=0, showscale=h == 0, row=row, col=col,
                        colorbar={"title": "log10 share"},
                        hovertemplate="query block %{y}, key block %{x}: 10^%{z:.2f}<extra></extra>")
        query, key = np.nonzero(maps.kept[h])
        fig.add_scatter(x=key, y=query, mode="markers", marker={"symbol": "square-open", "color": "white", "size": 7},
                        name="kept", showlegend=h == 0, row=row, col=col)
        fig.update_yaxes(autorange="reversed", row=row, col=col)
    fig = style.apply_layout(fig, f"Layer {maps.layer}, N = {maps.num_tokens:,}: kept tiles (squares) over the real "
                                  f"attention, keep {maps.keep_fraction:g}", "key block", "query block",
                             height=330 * rows)
    return fig


def trade_off_figure(comparisons) -> go.Figure:
    """Per keep fraction: attention speedup and end-to-end speedup (left), first-token KL (right)."""
    skipped = [c.attention_flops_skipped_fraction * 100 for c in comparisons]
    labels = [f"keep {c.keep_fraction:g}" for c in comparisons]
    fig = make_subplots(rows=1, cols=2, subplot_titles=["speedup over dense (same backend)",
                                                        "first-token KL from dense (nats)"])
    fig.add_scatter(x=skipped, y=[c.attention_speedup for c in comparisons], text=labels, mode="lines+markers+text",
                    textposition="top center", name="attention", line_color=style.ATTENTION, row=1, col=1)
    fig.add_scatter(x=skipped, y=[c.ttft_speedup for c in comparisons], mode="lines+markers",
                    name="time to first token", line_color=style.PREFILL, row=1, col=1)
    fig.add_scatter(x=skipped, y=[c.amdahl_cap for c in comparisons], mode="lines", name="Amdahl cap", line_dash="dot",
                    line_color=style.NEUTRAL, row=1, col=1)
    fig.add_scatter(x=skipped, y=[max(c.first_token_kl, 1e-9) for c in comparisons], text=labels,
                    mode="lines+markers", name="KL", line_color=style.EVICTED, row=1, col=2)
    fig.update_yaxes(type="log", row=1, col=2)
    return style.apply_layout(fig, "The trade-off as fewer blocks are kept", "attention FLOPs skipped (%)", "")


def dense_sparse_ttft_figure(comparison) -> go.Figure:
    """One ``SparseComparison``: the dense and the block-sparse time to first token, each split into attention and
    the rest, with Amdahl's floor: the dense TTFT less the skipped share of its attention."""
    ways = ["dense", f"block-sparse (keep {comparison.keep_fraction:g})"]
    attention = [comparison.dense_attention_s, comparison.sparse_attention_s]
    rest = [comparison.dense_ttft_s - comparison.dense_attention_s,
            comparison.sparse_ttft_s - comparison.sparse_attention_s]
    fig = go.Figure()
    fig.add_bar(x=ways, y=attention, name="attention (scoring included)", marker_color=style.ATTENTION)
    fig.add_bar(x=ways, y=rest, name="the rest of TTFT (linears, norms, sampling, ...)", marker_color=style.MLP)
    floor = comparison.dense_ttft_s / comparison.amdahl_skip_cap
    fig.add_hline(y=floor, line_dash="dot", line_color=style.NEUTRAL,
                  annotation_text=f"Amdahl's floor for skipping {comparison.attention_flops_skipped_fraction:.0%} of "
                                  f"attention: {floor:,.2f} s ({comparison.amdahl_skip_cap:.2f}× faster)")
    fig.update_layout(barmode="stack")
    runs = "one timed run" if comparison.runs == 1 else f"median of {comparison.runs} timed runs"
    return style.apply_layout(fig, f"Time to first token at N = {comparison.num_tokens:,} ({runs} each)", "", "seconds")
