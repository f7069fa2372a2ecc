"""The figures a step can show, one builder per figure name in ``ActionKind.figures``: each
draws an ``ActionOutcome``'s raw results with the app's figure modules.
"""

from __future__ import annotations

import statistics

import plotly.graph_objects as go

from prefillviz.figures import chunked as chunked_figures
from prefillviz.figures import kv_cache as kv_figures
from prefillviz.figures import parallel as parallel_figures
from prefillviz.figures import prefill as prefill_figures
from prefillviz.figures import prefix as prefix_figures
from prefillviz.figures import style
from prefillviz.lessons.actions import ActionOutcome


# --- prefill
def _ttft_breakdown_figure(outcome: ActionOutcome) -> go.Figure:
    result = outcome.raw["prefill"]
    return prefill_figures.ttft_breakdown_figure(result.timing.requests[result.request_id].ttft_breakdown_s)


# --- kv_memory
def _memory_growth_figure(outcome: ActionOutcome) -> go.Figure:
    return kv_figures.memory_growth_figure(outcome.raw["growth"])


def _gqa_figure(outcome: ActionOutcome) -> go.Figure:
    return kv_figures.gqa_bars_figure(outcome.raw["report"])


# --- ttft_ratio
def _ttft_bars_figure(outcome: ActionOutcome) -> go.Figure:
    times = outcome.raw["times"]
    labels = [f"{n} tokens" for n in times]
    values = [statistics.median(t) * 1e3 for t in times.values()]
    bars = go.Bar(x=labels, y=values, marker_color=style.PREFILL, text=[f"{v:,.1f} ms" for v in values], textposition="outside")
    fig = go.Figure(bars)
    fig.update_yaxes(range=[0, max(values) * 1.2])
    runs = len(next(iter(times.values())))
    title = f"Time to first token (median of {runs} runs after a warm-up)"
    return style.apply_layout(fig, title, "prompt of real prose", "time to first token (ms)", height=380)


# --- parallel_vs_sequential
def _step_latency_figure(outcome: ActionOutcome) -> go.Figure:
    return parallel_figures.step_latency_figure(outcome.raw["parallel"])


def _kv_difference_figure(outcome: ActionOutcome) -> go.Figure:
    return parallel_figures.kv_difference_figure(outcome.raw["parallel"].equality)


# --- roofline
def _roofline_figure(outcome: ActionOutcome) -> go.Figure:
    result = outcome.raw["roofline"]
    return parallel_figures.roofline_figure(result.peaks, result.points)


# --- chunked
def _chunked_latency_figure(outcome: ActionOutcome) -> go.Figure:
    comparison = outcome.raw["chunked"]
    summaries = {"chunking off": comparison.summary_off, "chunking on": comparison.summary_on}
    return chunked_figures.latency_figure(summaries, "Decoding users' inter-token latency (ITL) and the long prompt's TTFT")


# --- prefix
def _prefix_ttft_figure(outcome: ActionOutcome) -> go.Figure:
    return prefix_figures.ttft_figure(outcome.raw["prefix"], "Time to first token of each request, prefix cache on vs off")
