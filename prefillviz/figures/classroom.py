"""The class's predictions of one lesson step as a histogram, with the measured answer marked."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.figures.style import CACHE_HIT, NEUTRAL, apply_layout


def class_predictions_figure(
    labels: list[str], counts: list[int], answer_index: int | None, answer_text: str | None, question: str
) -> go.Figure:
    """One bar per option of the step's question: how many in the room predicted it.

    Args:
        labels: the options as the slider or the radio shows them.
        counts: predictions per option.
        answer_index: the option the measured answer falls in (or is nearest to); None before the reveal.
        answer_text: the measured answer as the reveal writes it.
        question: the step's question (the title).
    """
    colors = [CACHE_HIT if i == answer_index else NEUTRAL for i in range(len(labels))]
    fig = go.Figure(go.Bar(x=labels, y=counts, marker_color=colors, text=[str(c) if c else "" for c in counts],
                           textposition="outside", hovertemplate="%{x}: %{y} prediction(s)<extra></extra>"))
    total = sum(counts)
    measured_note = f" · measured: {answer_text}" if answer_text is not None else ""
    title = f"The class's predictions ({total} locked in)" + measured_note
    apply_layout(fig, title, question, "predictions", height=380)
    fig.update_xaxes(type="category")
    fig.update_yaxes(rangemode="tozero", dtick=max(1, total // 8) if total else 1)
    if answer_index is not None:
        fig.add_annotation(x=labels[answer_index], y=counts[answer_index], text="measured", showarrow=True, arrowhead=2,
                           ay=-40, font={"color": CACHE_HIT, "size": 16})
    return fig
