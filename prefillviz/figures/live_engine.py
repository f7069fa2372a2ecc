"""Figures of a running server's live record (``prefillviz serve``'s ``/prefillviz/steps``): pure plotly.

    step budget   one bar per step: each request's chunk a segment (prefill solid, decode hatched), the budget a line
    KV blocks     blocks in use after each step, and the blocks each step found in the prefix cache
    TTFT split    per finished request: queue, the steps it rode, the steps it sat out, the loop between steps

A request is named by the tag its client gave it (OpenAI's ``user``: "student 7", "teacher", "you") and a short id;
the viewer's own requests (``own_ids``) are marked with a star and a dark outline.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from prefillviz.figures.probe_load import legend_below
from prefillviz.figures.style import CACHE_HIT, DECODE, NEUTRAL, PREFILL, SEQUENCE, apply_layout

SPLIT_PARTS = (  # (key, label, colour)
    ("queue_s", "queue (waiting to be scheduled)", NEUTRAL),
    ("rode_s", "steps with its prefill (and others' decodes)", PREFILL),
    ("sat_out_s", "steps it sat out", DECODE),
    ("between_steps_s", "between steps (the server's loop)", CACHE_HIT),
)


def short_id(request_id: str) -> str:
    """``cmpl-3f2a...`` -> ``3f2a9c``: enough to tell requests apart on a chart."""
    return request_id.rsplit("-", 1)[-1][:6]


OWN_MARK = "★ "
OWN_OUTLINE = {"width": 2.5, "color": "#222222"}


def request_label(request_id: str, user: str | None, own_ids: frozenset[str] | set[str] = frozenset()) -> str:
    """``student 7 · 3f2a9c``: the client's tag and a short id (two requests of one student stay apart); starred
    when it is the viewer's own."""
    name = f"{user} · {short_id(request_id)}" if user else short_id(request_id)
    return OWN_MARK + name if request_id in own_ids else name


def step_budget_figure(snapshot: dict, max_steps: int = 120, own_ids: frozenset[str] | set[str] = frozenset(),
                       ) -> go.Figure:
    """The last ``max_steps`` steps: how each filled its token budget, request by request. A decode is one token,
    too thin to see beside a chunk of hundreds: the lower panel counts the decodes on their own scale."""
    steps = snapshot["steps"][-max_steps:]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.06)
    colours: dict[str, str] = {}
    users: dict[str, str] = {}
    segments: dict[tuple[str, bool], dict[str, list]] = {}  # (request, is prefill) -> its bars
    for step in steps:
        users.update(step.get("users", {}))  # a server from before the tags sends none
        for request_id, num_tokens, is_prefill in step["chunks"]:
            colours.setdefault(request_id, SEQUENCE[len(colours) % len(SEQUENCE)])
            seg = segments.setdefault((request_id, is_prefill), {"x": [], "y": []})
            seg["x"].append(step["index"])
            seg["y"].append(num_tokens)
    for (request_id, is_prefill), seg in segments.items():
        what = "prefill chunk" if is_prefill else "decode"
        label = request_label(request_id, users.get(request_id), own_ids)
        outline = OWN_OUTLINE if request_id in own_ids else {"width": 0.5}
        marker = {"color": colours[request_id], "pattern": {"shape": "" if is_prefill else "/"}, "line": outline}
        fig.add_trace(go.Bar(
            x=seg["x"], y=seg["y"], name=label, showlegend=False, marker=marker,
            hovertemplate=f"{label}: {what}<br>step %{{x}}: %{{y}} tokens<extra></extra>",
        ), row=1 if is_prefill else 2, col=1)
    if steps:
        x = [steps[0]["index"] - 0.5, steps[-1]["index"] + 0.5]
        fig.add_trace(go.Scatter(x=x, y=[snapshot["token_budget"]] * 2, mode="lines",
                                 line={"dash": "dash", "color": NEUTRAL}, name="token budget"), row=1, col=1)
    fig.update_layout(barmode="stack", bargap=0.1)
    fig = apply_layout(fig, "Each step's token budget: prefill chunks (solid) and decodes (hatched), per request",
                       "", "", height=520)
    fig.update_yaxes(title_text="prefill tokens", row=1, col=1)
    fig.update_yaxes(title_text="decodes", row=2, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    return fig


def kv_blocks_figure(snapshot: dict, max_steps: int = 120) -> go.Figure:
    """KV blocks in use after each step, and the prefix-cache hits each step found."""
    steps = snapshot["steps"][-max_steps:]
    x = [step["index"] for step in steps]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=[step["blocks_in_use"] for step in steps], mode="lines+markers",
                             name="blocks in use", line={"color": PREFILL}))
    fig.add_trace(go.Bar(x=x, y=[step["blocks_hit"] for step in steps], name="blocks hit in the prefix cache",
                         marker={"color": CACHE_HIT}))
    fig.update_yaxes(range=[0, max(snapshot["num_blocks"], 1)])
    return apply_layout(fig, f"KV blocks: in use of {snapshot['num_blocks']:,}, and prefix-cache hits", "step",
                        "blocks")


def ttft_split_figure(snapshot: dict, max_requests: int = 30, own_ids: frozenset[str] | set[str] = frozenset(),
                      ) -> go.Figure:
    """Each finished request's time to first token, split exactly into its parts (they add up to it)."""
    requests = [r for r in snapshot["requests"] if r.get("ttft_s") is not None][-max_requests:]
    labels = [f"{request_label(r['request_id'], r.get('user'), own_ids)} ({r['num_prompt_tokens']} tok)"
              for r in requests]
    fig = go.Figure()
    for key, label, colour in SPLIT_PARTS:
        fig.add_trace(go.Bar(
            y=labels, x=[r[key] * 1000 for r in requests], name=label, orientation="h", marker={"color": colour},
            customdata=[[r["num_prefill_steps"], r["decodes_beside"], r["num_cached_tokens"]] for r in requests],
            hovertemplate=(f"{label}: %{{x:.1f}} ms<br>%{{customdata[0]}} prefill steps beside "
                           "%{customdata[1]} decodes; %{customdata[2]} prompt tokens from the cache<extra></extra>"),
        ))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(autorange="reversed")
    return legend_below(apply_layout(fig, "Time to first token of each finished request, split", "milliseconds",
                                     "request", height=max(360, 28 * len(requests) + 200)))
