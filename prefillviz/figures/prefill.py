"""Figures of one prefill: the tokens, the one-pass diagram, the TTFT breakdown and the
first-token distribution. Every number drawn comes from the traces passed in."""

from __future__ import annotations

import html

import plotly.graph_objects as go

from prefillviz.analysis.first_token import FirstTokenView
from prefillviz.engine.trace import Trace
from prefillviz.figures import style


def token_chips_html(token_texts: list[str], token_ids: list[int], max_tokens: int = 400) -> str:
    """Tokens as chips with their ids (HTML); whitespace made visible, text escaped."""
    chips = []
    for text, token_id in list(zip(token_texts, token_ids))[:max_tokens]:
        shown = html.escape(text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")) or "∅"
        chips.append(
            f'<span style="display:inline-block;margin:2px;padding:2px 6px;border-radius:6px;'
            f'background:{style.PARTIAL};font-family:monospace;font-size:1.05em">{shown}'
            f'<sub style="color:#555;margin-left:3px">{token_id}</sub></span>'
        )
    more = len(token_ids) - max_tokens
    if more > 0:
        chips.append(f"<span> … and {more:,} more tokens</span>")
    return "".join(chips)


def one_pass_diagram(timing: Trace, inspection: Trace, request_id: str, first_token_text: str) -> go.Figure:
    """N tokens in -> K/V for N positions written in every layer -> one distribution out.

    N, the writes and bytes come from the inspection pass's KV write log; the time from the
    timing pass; the distribution from the sampled logits.
    """
    record = timing.requests[request_id]
    step = timing.steps[0]
    writes = [s.kv_writes for s in inspection.steps if s.kv_writes is not None]
    num_layers = len(writes[0].layers_written) if writes else 0
    positions = sum(len(w.positions) for w in writes)
    kv_bytes = sum(w.bytes_per_layer * len(w.layers_written) for w in writes)
    prob = record.first_token_top_probs[0] if record.first_token_top_probs else float("nan")
    boxes = [
        (
            0.0,
            f"<b>{record.num_prompt_tokens:,} tokens in</b><br>one (1, {record.num_prompt_tokens}) batch<br>"
            f"step 1 of {timing.num_steps}",
            style.PREFILL,
        ),
        (
            0.37,
            f"<b>{num_layers} layers</b>, one pass<br>K,V written for {positions:,} positions<br>in each layer = "
            f"{num_layers * positions:,} writes<br>{kv_bytes / 2**20:,.2f} MiB of KV cache<br>"
            f"forward {step.forward_time_s * 1000:,.1f} ms",
            style.ATTENTION,
        ),
        (
            0.74,
            f"<b>1 distribution out</b><br>top token {html.escape(repr(first_token_text))}<br>p = {prob:.3f}",
            style.DECODE,
        ),
    ]
    fig = go.Figure()
    for x, text, color in boxes:
        fig.add_shape(
            type="rect", x0=x, x1=x + 0.26, y0=0.1, y1=0.9, line={"color": color, "width": 3}, fillcolor=color,
            opacity=0.15,
        )
        fig.add_annotation(x=x + 0.13, y=0.5, text=text, showarrow=False, font={"size": style.FONT_SIZE})
    for x in (0.26, 0.63):
        fig.add_annotation(
            x=x + 0.11, y=0.5, ax=x + 0.005, ay=0.5, xref="x", yref="y", axref="x", ayref="y",
            showarrow=True, arrowhead=3, arrowwidth=3, text="",
        )
    fig.update_xaxes(visible=False, range=[0, 1])
    fig.update_yaxes(visible=False, range=[0, 1])
    return style.apply_layout(fig, "Prefill: the whole prompt in one forward pass (measured)", "", "", height=300)


TTFT_PARTS = {  # the breakdown's key: (its label, its colour), in the order they happen
    "tokenize_s": ("tokenize", style.NEUTRAL),
    "schedule_s": ("schedule + pack", style.OTHER),
    "forward_s": ("forward (prefill)", style.PREFILL),
    "sample_s": ("sample", style.DECODE),
    "detokenize_s": ("detokenize", style.NORMS),
    "other_s": ("other", style.FREE),
}


def ttft_breakdown_figure(breakdown_s: dict[str, float]) -> go.Figure:
    """One horizontal stacked bar: where the time to the first token went (ms)."""
    fig = go.Figure()
    for key, (label, color) in TTFT_PARTS.items():
        value_ms = breakdown_s.get(key, 0.0) * 1000
        fig.add_bar(y=["TTFT"], x=[value_ms], name=f"{label} {value_ms:,.2f} ms", orientation="h", marker_color=color)
    fig.update_layout(barmode="stack")
    total = breakdown_s.get("total_s", 0.0) * 1000
    return style.apply_layout(fig, f"Time to first token: {total:,.1f} ms", "time (ms)", "", height=240)


def first_token_figure(view: FirstTokenView, decode) -> go.Figure:
    """Top tokens, greedy distribution vs the chosen sampling settings (probability)."""
    labels = [repr(decode(t)) for t in view.greedy.top_token_ids]
    fig = go.Figure()
    fig.add_bar(x=labels, y=view.greedy.top_probs, name="greedy (temperature 1, no cut)", marker_color=style.PREFILL)
    sampling = dict(zip(view.sampling.top_token_ids, view.sampling.top_probs))
    fig.add_bar(
        x=labels, y=[sampling.get(t, 0.0) for t in view.greedy.top_token_ids], name="with your sampling settings",
        marker_color=style.DECODE,
    )
    fig.update_layout(barmode="group")
    title = (
        f"First-token distribution · entropy {view.greedy.entropy_nats:.2f} nats (greedy) · "
        f"sampled {decode(view.sampled_token_id)!r}, rank {view.sampled_token_rank}"
    )
    return style.apply_layout(fig, title, "next token", "probability")
