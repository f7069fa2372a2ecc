"""Presenter mode (large text, fewer controls, for a projector) and the charts that follow the
sidebar's image format."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

PRESENTER_CSS = """<style>
html, body, [data-testid="stAppViewContainer"] { font-size: 22px; }
[data-testid="stMarkdownContainer"] p, [data-testid="stMarkdownContainer"] li { font-size: 1.3rem; line-height: 1.5; }
h1 { font-size: 3.2rem !important; }
h2, h3 { font-size: 2.1rem !important; }
[data-testid="stMetricValue"] { font-size: 3rem !important; }
[data-testid="stCaptionContainer"] { font-size: 1.1rem !important; }
[data-testid="stDownloadButton"] { display: none; }
</style>"""


def presenter_mode() -> bool:
    """Large fonts and fewer controls, for a projector (the sidebar toggle)."""
    return bool(st.session_state.get("presenter_mode", False))


def chart(figure: go.Figure, key: str, **kwargs):
    """``st.plotly_chart`` with the camera button saving PNG or SVG (the sidebar's choice)."""
    image_format = st.session_state.get("export_format", "png")
    config = {"displaylogo": False, "toImageButtonOptions": {"format": image_format, "filename": key, "scale": 2}}
    return st.plotly_chart(figure, key=key, config=config, **kwargs)
