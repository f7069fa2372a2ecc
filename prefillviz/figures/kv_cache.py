"""Figures of the KV cache one inspection run filled: what each layer wrote per position,
the physical blocks it used, how its size grew against the formula, and what GQA saves.

Every number drawn comes from the trace (its KV write log and block allocations) or from
``kv_memory_report`` for the model that ran.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from prefillviz.analysis.memory import KVMemoryReport
from prefillviz.engine.trace import Trace
from prefillviz.experiments.inspect_run import KV_QUANTITIES, kv_write_matrix
from prefillviz.experiments.kv_memory import BlockUsage, MemoryGrowth
from prefillviz.figures import style

COLORBAR_TITLES = {
    "key_norm": "‖k‖₂ (no unit),<br>mean of KV heads",
    "value_norm": "‖v‖₂ (no unit),<br>mean of KV heads",
    "bytes": "K + V written<br>(bytes)",
}
BLOCK_STATES = [("free", style.FREE), ("partly filled", style.PARTIAL), ("filled", style.CACHE_HIT)]  # z = 0, 1, 2


def token_label(position: int, text: str) -> str:
    """A short unique axis label: the position and the token, whitespace made visible."""
    shown = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")
    shown = shown if len(shown) <= 12 else shown[:11] + "…"
    return f"{position} {shown}"


def _mean_pool_columns(
    positions: np.ndarray, matrix: np.ndarray, max_columns: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Average columns in bins of ceil(N / max_columns) positions; returns bin starts, pooled, bin size."""
    num = matrix.shape[1]
    bin_size = max(1, math.ceil(num / max_columns))
    if bin_size == 1:
        return positions, matrix, 1
    num_bins = math.ceil(num / bin_size)
    pooled = np.stack([matrix[:, b * bin_size : (b + 1) * bin_size].mean(axis=1) for b in range(num_bins)], axis=1)
    return positions[::bin_size], pooled, bin_size


def kv_writes_heatmap(
    trace: Trace,
    request_id: str,
    quantity: str = "key_norm",
    token_texts: list[str] | None = None,
    max_columns: int = 512,
    max_token_labels: int = 48,
) -> go.Figure:
    """Layers x positions heatmap of the KV writes of one request (from the write log).

    Args:
        trace: an inspection trace.
        request_id: the request.
        quantity: ``"key_norm"``, ``"value_norm"`` (mean over KV heads) or ``"bytes"``.
        token_texts: the prompt's tokens, to label the position axis of short prompts.
        max_columns: longer prompts are averaged over bins of positions to this many columns.
        max_token_labels: label the axis with tokens up to this many positions.
    """
    positions, matrix = kv_write_matrix(trace, request_id, quantity)
    num_positions = len(positions)
    x, z, bin_size = _mean_pool_columns(positions, matrix, max_columns)
    fig = go.Figure(
        go.Heatmap(
            z=z.astype(np.float32),
            x=x,
            y=list(range(z.shape[0])),
            colorscale=style.HEATMAP_SCALE,
            colorbar={"title": {"text": COLORBAR_TITLES[quantity]}},
            hovertemplate="layer %{y}<br>position %{x}<br>%{z:,.3f}<extra></extra>",
        )
    )
    if token_texts is not None and bin_size == 1 and num_positions <= max_token_labels:
        fig.update_xaxes(
            tickmode="array", tickvals=list(positions),
            ticktext=[token_label(int(p), token_texts[int(p)]) for p in positions], tickangle=-60,
        )
    x_title = "position (token)" if bin_size == 1 else f"position (token; mean over bins of {bin_size})"
    title = (
        f"KV writes: {KV_QUANTITIES[quantity]} per layer and position "
        f"({z.shape[0]} layers x {num_positions:,} positions)"
    )
    return style.apply_layout(fig, title, x_title, "layer", height=520)


def block_table_figure(usage: BlockUsage, columns: int | None = None) -> go.Figure:
    """Every physical block of the cache as one cell: filled, partly filled or free.

    Cell ``b`` is block id ``b`` (row ``b // columns``, column ``b % columns``), coloured by
    what the request held in it at the end of its prefill. ``columns`` defaults to 32, or
    64 for caches of more than 1,024 blocks.
    """
    columns = columns or (64 if usage.num_blocks > 1024 else 32)
    columns = max(1, min(columns, usage.num_blocks))
    rows = math.ceil(usage.num_blocks / columns)
    z = np.full((rows, columns), np.nan)
    hover = np.full((rows, columns), "", dtype=object)
    for block in range(usage.num_blocks):
        z[block // columns, block % columns] = 0
        hover[block // columns, block % columns] = f"block {block}: free"
    for logical, (block, tokens) in enumerate(zip(usage.block_ids, usage.tokens_in_block)):
        state = 2 if tokens == usage.block_size else 1
        z[block // columns, block % columns] = state
        first = logical * usage.block_size
        hover[block // columns, block % columns] = (
            f"block {block}: logical block {logical}, {tokens}/{usage.block_size} tokens "
            f"(positions {first}–{first + tokens - 1})"
        )
    colorscale = []
    for state, (_, color) in enumerate(BLOCK_STATES):
        colorscale += [[state / 3, color], [(state + 1) / 3, color]]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(columns)),
            y=list(range(rows)),
            zmin=-0.5,
            zmax=2.5,
            colorscale=colorscale,
            showscale=False,
            xgap=2,
            ygap=2,
            text=hover,
            hovertemplate="%{text}<extra></extra>",
        )
    )
    counts = {"filled": usage.num_filled, "partly filled": usage.num_partial, "free": usage.num_free}
    for name, color in reversed(BLOCK_STATES):  # legend entries with the counts
        fig.add_scatter(
            x=[None], y=[None], mode="markers", marker={"symbol": "square", "size": 14, "color": color},
            name=f"{name}: {counts[name]:,}",
        )
    fig.update_yaxes(autorange="reversed")
    title = (
        f"Block table: {len(usage.block_ids)} of {usage.num_blocks:,} blocks used "
        f"({usage.block_size} tokens each), {usage.num_free:,} free"
    )
    return style.apply_layout(
        fig, title, f"block id mod {columns}", f"block id // {columns}", height=max(260, 60 + 18 * rows + 80)
    )


def memory_growth_figure(growth: MemoryGrowth) -> go.Figure:
    """KV bytes against tokens in the cache: the write log (cumulated per step), the formula
    line, and the whole blocks the engine reserved."""
    num_tokens = int(growth.tokens[-1])
    tokens = np.arange(num_tokens + 1)
    per_token = growth.bytes_per_token
    fig = go.Figure()
    fig.add_scatter(
        x=tokens,
        y=tokens * per_token,
        mode="lines",
        name=f"formula: {per_token:,} B x tokens",
        line={"color": style.NEUTRAL, "dash": "dash"},
    )
    fig.add_scatter(
        x=tokens,
        y=np.ceil(tokens / growth.block_size) * growth.block_size * per_token,
        mode="lines",
        line_shape="hv",
        name=f"reserved in whole blocks of {growth.block_size} tokens",
        line={"color": style.PARTIAL, "width": 3},
    )
    fig.add_scatter(
        x=growth.tokens,
        y=growth.bytes_reserved,
        mode="markers",
        name="blocks the engine held after each step",
        marker={"color": style.CACHE_HIT, "size": 11, "symbol": "square-open", "line": {"width": 2}},
    )
    fig.add_scatter(
        x=growth.tokens,
        y=growth.bytes_written,
        mode="lines+markers",
        name="measured: bytes written (KV write log), cumulated per step",
        line={"color": style.PREFILL, "width": 3},
        marker={"size": 9},
    )
    title = f"KV cache growth: {int(growth.bytes_written[-1]):,} B for {num_tokens:,} tokens"
    style.apply_layout(fig, title, "tokens in the cache", "KV cache size (bytes)", height=460)
    fig.update_layout(
        legend={"orientation": "v", "x": 0.01, "y": 0.99, "xanchor": "left", "yanchor": "top", "font": {"size": 13}}
    )
    return fig


def gqa_bars_figure(report: KVMemoryReport) -> go.Figure:
    """This model's KV bytes per token (GQA) next to the same model with one KV head per query head (MHA)."""
    labels = [f"this model (GQA)<br>{report.num_kv_heads} KV heads", f"MHA equivalent<br>{report.num_heads} KV heads"]
    values = [report.bytes_per_token, report.mha_bytes_per_token]
    fig = go.Figure(
        go.Bar(
            x=labels,
            y=values,
            marker_color=[style.PREFILL, style.NEUTRAL],
            text=[f"{v:,} B" for v in values],
            textposition="outside",
        )
    )
    fig.update_yaxes(range=[0, max(values) * 1.2])
    title = f"GQA: {report.gqa_saving_factor:g}x smaller KV cache ({report.dtype})"
    return style.apply_layout(fig, title, "", "KV cache per token (bytes)", height=400)

