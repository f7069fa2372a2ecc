"""One colour language and one layout for every figure, readable on a projector.

    prefill  blue      decode  orange      cache hit  green
    free     light grey   partial  light blue   evicted  red
"""

from __future__ import annotations

import plotly.graph_objects as go

PREFILL = "#1f77b4"
DECODE = "#ff7f0e"
CACHE_HIT = "#2ca02c"
FREE = "#d9d9d9"
PARTIAL = "#9ecae1"
EVICTED = "#d62728"
NEUTRAL = "#7f7f7f"
ATTENTION = "#9467bd"
MLP = "#8c564b"
NORMS = "#e377c2"
OTHER = "#bcbd22"
SEQUENCE = [PREFILL, DECODE, CACHE_HIT, ATTENTION, MLP, NORMS, OTHER, EVICTED, NEUTRAL]
HEATMAP_SCALE = "Viridis"

FONT_SIZE = 16  # readable from the back of a classroom


def apply_layout(fig: go.Figure, title: str, x_title: str, y_title: str, height: int = 420) -> go.Figure:
    """Title, axis titles (with units), fonts and margins shared by every figure."""
    fig.update_layout(
        title={"text": title, "x": 0.0, "xanchor": "left"},
        font={"size": FONT_SIZE},
        height=height,
        margin={"l": 70, "r": 30, "t": 60, "b": 60},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "right", "x": 1.0},
        template="plotly_white",
    )
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title)
    return fig
