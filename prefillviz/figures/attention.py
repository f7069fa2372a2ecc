"""Figures of the attention one inspection run computed, rebuilt from its captured q/k:

    P_h = softmax(q_h k_{h // groups}^T * scaling + causal mask)

one head's map (max-pooled to at most ``max_size`` x ``max_size`` for long prompts, with the
chunks of a chunked run drawn as strips of the causal matrix), and a grid of every head's
entropy and sink score that can be clicked to pick a head.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from prefillviz.analysis.attention_maps import ChunkStrip, pooled_attention_map
from prefillviz.figures import style
from prefillviz.figures.kv_cache import token_label

GRID_METRICS = [
    ("entropy", "entropy (nats)", "nats"),
    ("sink", "sink score (probability on token 0)", "probability"),
]


def attention_map_figure(
    q,
    k,
    head: int,
    scaling: float,
    layer: int,
    token_texts: list[str] | None = None,
    strips: list[ChunkStrip] | None = None,
    max_size: int = 256,
    log_scale: bool = False,
) -> go.Figure:
    """One head's causal attention map, rebuilt from post-RoPE q/k of one layer.

    Args:
        q: (H, N, D) queries of the layer; k: (KVH, N, D) keys.
        head: query head (it reads KV head ``head // (H // KVH)``).
        scaling: the layer's softmax scale.
        layer: the layer index, for the title.
        token_texts: the prompt's tokens: axes show them when every bin is one position.
        strips: chunks of a chunked run, drawn as rectangles (query rows x key columns).
        max_size: the most bins per axis (longer prompts are max-pooled: a cell is the
            largest probability in its block, so peaks stay visible).
        log_scale: colour by log10(probability) instead of probability.
    """
    pooled, edges = pooled_attention_map(q, k, head, scaling, max_size=max_size)  # (m, m), (m + 1,)
    num_tokens = int(edges[-1])
    bin_size = int(edges[1] - edges[0])
    num_bins = len(edges) - 1
    starts = edges[:-1]
    # cells entirely above the diagonal were masked: leave them blank
    above = starts[None, :] > (edges[1:] - 1)[:, None]
    z = pooled.astype(np.float32)  # float32 halves what is sent to the browser
    if log_scale:
        z = np.log10(np.maximum(z, 1e-6))
    z[above] = np.nan
    if bin_size == 1 and token_texts is not None:
        labels = [token_label(i, token_texts[i]) for i in range(num_tokens)]
    else:
        labels = [f"{a}–{b - 1}" if b - a > 1 else f"{a}" for a, b in zip(edges[:-1], edges[1:])]
    colorbar = "log10 probability" if log_scale else "probability"
    if bin_size > 1:
        colorbar = f"max {colorbar}<br>in a {bin_size}x{bin_size} block"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=labels,
            y=labels,
            colorscale=style.HEATMAP_SCALE,
            zmin=-6 if log_scale else 0.0,
            zmax=0.0 if log_scale else 1.0,
            colorbar={"title": {"text": colorbar}},
            hovertemplate="query %{y}<br>key %{x}<br>%{z:.4f}<extra></extra>",
        )
    )
    for strip in strips or []:
        _add_strip(fig, strip, bin_size, num_bins)
    fig.update_yaxes(autorange="reversed")
    groups = q.shape[0] // k.shape[0]
    pooled_note = "" if bin_size == 1 else f", max-pooled to {num_bins}x{num_bins}"
    title = (
        f"Layer {layer}, head {head} (KV head {head // groups}): "
        f"{num_tokens:,} x {num_tokens:,} causal map{pooled_note}"
    )
    unit = "token" if bin_size == 1 else f"bin of {bin_size} positions"
    return style.apply_layout(fig, title, f"key position ({unit})", f"query position ({unit})", height=620)


def _add_strip(fig: go.Figure, strip: ChunkStrip, bin_size: int, num_bins: int) -> None:
    """A chunk's rectangle on the category axes (cell b spans b - 0.5 .. b + 0.5)."""
    def edge(position: int) -> float:
        return min(position / bin_size, num_bins) - 0.5

    color = style.SEQUENCE[strip.chunk_index % len(style.SEQUENCE)]
    fig.add_shape(
        type="rect",
        x0=edge(strip.key_start),
        x1=edge(strip.key_end),
        y0=edge(strip.query_start),
        y1=edge(strip.query_end),
        line={"color": color, "width": 3},
        fillcolor="rgba(0,0,0,0)",
        name=f"chunk {strip.chunk_index}",
    )
    fig.add_annotation(
        x=edge(strip.key_end),
        y=(edge(strip.query_start) + edge(strip.query_end)) / 2,
        text=f"chunk {strip.chunk_index}",
        showarrow=False,
        xanchor="left",
        font={"color": color},
    )


def head_grid_figure(summaries: dict[str, np.ndarray], selected: tuple[int, int] | None = None) -> go.Figure:
    """Every head's entropy and sink score, layers x heads, side by side.

    Drawn as square markers (not a heatmap: Streamlit gets no selection from heatmap clicks)
    so that clicking a cell is a point selection the page can read: x = head, y = layer.

    Args:
        summaries: ``all_head_summaries`` output: ``"entropy"`` and ``"sink"`` (layers, heads).
        selected: (layer, head) to outline.
    """
    num_layers, num_heads = summaries["entropy"].shape
    height = max(420, 22 * num_layers + 140)
    cell = (height - 140) / num_layers * 0.92  # marker size in px: one row per layer
    fig = make_subplots(rows=1, cols=2, subplot_titles=[title for _, title, _ in GRID_METRICS], horizontal_spacing=0.16)
    layers, heads = np.meshgrid(np.arange(num_layers), np.arange(num_heads), indexing="ij")
    for column, (name, _, colorbar) in enumerate(GRID_METRICS, start=1):
        values = summaries[name]
        fig.add_scatter(
            x=heads.ravel(),
            y=layers.ravel(),
            mode="markers",
            marker={
                "symbol": "square",
                "size": cell,
                "color": values.ravel(),
                "colorscale": style.HEATMAP_SCALE,
                "colorbar": {"title": {"text": colorbar}, "x": 0.42 if column == 1 else 1.0, "len": 0.9},
                "line": {"width": 0},
            },
            hovertemplate=f"layer %{{y}}, head %{{x}}<br>{name} %{{marker.color:.3f}}<extra></extra>",
            name=name,
            showlegend=False,
            row=1,
            col=column,
        )
        if selected is not None:
            fig.add_scatter(
                x=[selected[1]],
                y=[selected[0]],
                mode="markers",
                marker={"symbol": "square-open", "size": cell + 4, "color": style.EVICTED, "line": {"width": 3}},
                hoverinfo="skip",
                showlegend=False,
                row=1,
                col=column,
            )
        fig.update_xaxes(tickmode="linear", dtick=1, range=[-0.6, num_heads - 0.4], row=1, col=column)
        fig.update_yaxes(range=[num_layers - 0.5, -0.5], row=1, col=column)
    title = f"Every head: {num_layers} layers x {num_heads} heads (click a cell to open that head)"
    style.apply_layout(fig, title, "head", "layer", height=height)
    fig.update_layout(clickmode="event+select", margin={"t": 90})
    return fig


def selected_head(selection: Any) -> tuple[int, int] | None:
    """(layer, head) of the clicked cell in a ``head_grid_figure`` selection, or None.

    A point's x is the head and its y the layer (both subplots, and the outline marker).
    """
    points = (selection or {}).get("points") or []
    for point in points:
        x, y = point.get("x"), point.get("y")
        if isinstance(x, (int, float)) and isinstance(y, (int, float)):
            return int(round(y)), int(round(x))
    return None
