"""A class's burst of requests (``experiments.class_burst``): each student's time to first token in arrival
order, and how many prompts shared each engine step.

    TTFT       one bar a student, in the order they arrived; a colour per step that gave the first tokens
    per step   prompts (their prefill chunks) and decodes in each step of the burst
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from prefillviz.experiments.class_burst import ClassBurst
from prefillviz.figures.style import DECODE, PREFILL, SEQUENCE, apply_layout


def burst_ttft_figure(burst: ClassBurst) -> go.Figure:
    """Above, each student's TTFT in arrival order, coloured by the step that sampled it; below, the prompts and
    decodes of each step of the burst (the steps with a prompt are where students got in)."""
    fig = make_subplots(rows=2, cols=1, row_heights=[0.62, 0.38], vertical_spacing=0.16,
                        subplot_titles=("each student's time to first token, in arrival order",
                                        "what each engine step ran"))
    first_token_steps = sorted({r.first_token_step for r in burst.requests})
    for wave, step in enumerate(first_token_steps):
        group = [r for r in burst.requests if r.first_token_step == step]
        fig.add_trace(go.Bar(
            x=[r.index + 1 for r in group], y=[r.ttft_s * 1000 for r in group],
            name=f"first token in step {step}", marker={"color": SEQUENCE[wave % len(SEQUENCE)]},
            customdata=[[r.num_prompt_tokens, r.num_cached_tokens, r.first_scheduled_step] for r in group],
            hovertemplate=(f"student %{{x}}: TTFT %{{y:,.1f}} ms, first token in step {step}<br>"
                           "prompt %{customdata[0]} tokens (%{customdata[1]} from the prefix cache), "
                           "first ran in step %{customdata[2]}<extra></extra>"),
        ), row=1, col=1)
    steps = [step.index for step in burst.steps]
    fig.add_trace(go.Bar(x=steps, y=[step.num_prompts for step in burst.steps], name="prompts (prefill chunks)",
                         marker={"color": PREFILL},
                         customdata=[[step.num_prompt_tokens, step.wall_s * 1000] for step in burst.steps],
                         hovertemplate=("step %{x}: %{y} prompts, %{customdata[0]} prompt tokens, "
                                        "%{customdata[1]:,.1f} ms<extra></extra>")), row=2, col=1)
    fig.add_trace(go.Bar(x=steps, y=[step.num_decodes for step in burst.steps], name="decodes (one token each)",
                         marker={"color": DECODE, "pattern": {"shape": "/"}},
                         hovertemplate="step %{x}: %{y} decodes<extra></extra>"), row=2, col=1)
    fig.update_layout(barmode="stack", bargap=0.15)
    fig = apply_layout(fig, f"{burst.num_students} students press Send at once: when each first token came",
                       "", "", height=620)
    fig.update_xaxes(title_text="student (arrival order)", row=1, col=1)
    fig.update_yaxes(title_text="TTFT (ms)", row=1, col=1, rangemode="tozero")
    fig.update_xaxes(title_text="engine step of the burst", row=2, col=1)
    fig.update_yaxes(title_text="requests", row=2, col=1, rangemode="tozero")
    return fig
