"""Figures of a load sweep on a probed server ("Your server"): TTFT percentiles and goodput
against load with the knee marked, and TTFT split into the server's waiting and prefill times."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from prefillviz.figures import style
from prefillviz.probe.load_stats import unit
from prefillviz.probe.load_sweep import LoadReport


def load_axis(report: LoadReport) -> str:
    return ("offered load (requests/s, Poisson arrivals)" if report.settings.mode == "rate"
            else "concurrent users (closed loop)")


def ttft_load_figure(report: LoadReport) -> go.Figure:
    """TTFT p50/p90/p99 (left axis) and goodput (right axis) against load; the knee as a vertical line."""
    settings = report.settings
    points = report.points
    loads = [p.load for p in points]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for q, color, dash in ((50, style.PREFILL, "solid"), (90, style.PARTIAL, "dot"), (99, style.EVICTED, "dash")):
        fig.add_scatter(x=loads, y=[(p.ttft_s(q) or 0) * 1e3 for p in points], mode="lines+markers", name=f"TTFT p{q}",
                        line={"color": color, "dash": dash},
                        hovertemplate=f"load %{{x:g}}: p{q} %{{y:,.0f}} ms<extra></extra>")
    fig.add_scatter(x=loads,
                    y=[(p.goodput_share(settings.ttft_target_s, settings.itl_target_s) or 0) * 100 for p in points],
                    mode="lines+markers", name="goodput (% of requests meeting both targets)",
                    line={"color": style.CACHE_HIT}, marker={"symbol": "diamond", "size": 10}, secondary_y=True,
                    hovertemplate="load %{x:g}: %{y:.0f}% good<extra></extra>")
    knee, reached = report.knee()
    if knee is not None and reached:
        fig.add_vline(x=points[knee].load, line={"color": "#444", "dash": "dash"},
                      annotation_text=f"knee: {points[knee].load:g} {unit(settings.mode)}",
                      annotation_position="top left")
    title = (f"Time to first token under load ({report.server['model']})<br>"
             f"<sup>goodput: the share of requests with TTFT ≤ "
             f"{settings.ttft_target_s * 1e3:,.0f} ms and a mean gap ≤ {settings.itl_target_s * 1e3:,.0f} ms</sup>")
    style.apply_layout(fig, title, load_axis(report), "time to first token (ms)", height=520)
    fig.update_yaxes(
        title_text="goodput (%)", range=[0, 105], tickvals=[0, 25, 50, 75, 100], showgrid=False, secondary_y=True
    )
    return legend_below(fig)


def legend_below(fig: go.Figure) -> go.Figure:
    """The legend under the plot: these figures' two-line titles fill the space above it."""
    fig.update_layout(
        legend={"orientation": "h", "yanchor": "top", "y": -0.2, "xanchor": "left", "x": 0.0},
        margin={"t": 90, "b": 110},
    )
    return fig


def split_figure(report: LoadReport) -> go.Figure:
    """Per load point: the server's mean wait before its scheduler, in its queue, and prefill stacked, beside
    the client's mean TTFT."""
    points = report.points
    labels = [f"{p.load:g}" for p in points]
    splits = [p.split() for p in points]
    fig = go.Figure()
    fig.add_bar(x=labels, y=[max(s["before_scheduler_s_mean"] or 0, 0) * 1e3 for s in splits],
                name="waiting before the scheduler (for the engine's running step; the API server)",
                marker_color=style.PARTIAL,
                hovertemplate="load %{x}: before the scheduler %{y:,.0f} ms<extra></extra>")
    fig.add_bar(x=labels, y=[(s["queue_s_mean"] or 0) * 1e3 for s in splits], name="waiting in the scheduler's queue",
                marker_color=style.NEUTRAL,
                hovertemplate="load %{x}: scheduler's queue %{y:,.0f} ms<extra></extra>")
    fig.add_bar(x=labels, y=[(s["prefill_s_mean"] or 0) * 1e3 for s in splits], name="prefill (server)",
                marker_color=style.PREFILL,
                hovertemplate="load %{x}: prefill %{y:,.0f} ms<extra></extra>")
    fig.add_scatter(x=labels, y=[(s["client_ttft_s_mean"] or 0) * 1e3 for s in splits], mode="markers",
                    name="TTFT the client saw (mean)",
                    marker={"color": "#222", "symbol": "line-ew-open", "size": 28, "line": {"width": 3}},
                    hovertemplate="load %{x}: client %{y:,.0f} ms<extra></extra>")
    fig.update_layout(barmode="stack")
    shares = [s["queue_share"] for s in splits]
    told = (f"waiting {shares[0]:.0%} of TTFT at the lightest load, {shares[-1]:.0%} at the heaviest"
            if shares and None not in shares else "the server does not export the queue and prefill histograms")
    title = f"Time to first token split into waiting and prefill, by the server's own histograms<br><sup>{told}</sup>"
    return legend_below(style.apply_layout(fig, title, load_axis(report), "mean time (ms)", height=520))
