"""A session's results (in ``st.session_state``: one user's results are never another's), and
the downloads of a figure and its data."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from prefillviz.ui.presenter import chart, presenter_mode


def save_result(page: str, value: Any) -> None:
    st.session_state.setdefault("results", {})[page] = value


def get_result(page: str) -> Any:
    return st.session_state.get("results", {}).get(page)


def downloads(name: str, key: str, figure: go.Figure | None = None, table: pd.DataFrame | list[dict] | None = None,
              data: Any = None) -> None:
    """Download buttons for a figure's data (CSV and/or JSON) and the figure as standalone HTML.

    Files are built only when clicked (deferred data), and the HTML embeds plotly.js so
    it opens offline. PNG and SVG come from each chart's own toolbar (camera icon).
    Presenter mode hides them (fewer controls on the projector).
    """
    if presenter_mode():
        return
    columns = st.columns(3)
    if table is not None:
        frame = table if isinstance(table, pd.DataFrame) else pd.DataFrame(table)
        columns[0].download_button(
            "Data (CSV)", lambda: frame.to_csv(index=False), f"{name}.csv", "text/csv", key=f"{key}_csv",
            on_click="ignore"
        )
    if data is not None:
        columns[1].download_button(
            "Data (JSON)", lambda: json.dumps(data, default=str), f"{name}.json", "application/json", key=f"{key}_json",
            on_click="ignore"
        )
    if figure is not None:
        columns[2].download_button(
            "Figure (HTML)", lambda: figure.to_html(include_plotlyjs=True), f"{name}.html", "text/html",
            key=f"{key}_html", on_click="ignore"
        )


def figure_section(title: str, text: str, figure: go.Figure, key: str, caption: bool = False) -> go.Figure:
    """A page's section around one chart: its subheader, what to look for (markdown, or a caption), the chart;
    returns the figure."""
    st.subheader(title)
    (st.caption if caption else st.markdown)(text)
    chart(figure, key=key)
    return figure
