"""Attention: every head's map over the prompt, rebuilt from the q/k the inspection pass captured."""

import streamlit as st

from prefillviz.analysis.attention_maps import causal_chunk_strips
from prefillviz.experiments import inspect_run
from prefillviz.figures import attention as figures
from prefillviz.ui.inspection_source import inspection_source
from prefillviz.ui.results import downloads
from prefillviz.ui.shell import page_frame

page_frame()


def open_clicked_head() -> None:
    """A click on the grid sets the layer and head pickers (they still work without clicking)."""
    clicked = figures.selected_head(st.session_state["attention_grid"]["selection"])
    if clicked is not None:
        st.session_state["attention_layer"], st.session_state["attention_head"] = clicked


st.title("Attention: who looks at whom during prefill")
st.markdown(
    "In every layer each query head mixes the values of the positions it attends to. Prefill computes all rows "
    "of this **causal** matrix at once: row *i* (a query) may only look at keys *j ≤ i*. The timing pass uses fast "
    "attention that never stores the probabilities, so the maps here are **rebuilt from the post-RoPE queries "
    "and keys the inspection pass captured**: `softmax(q kᵀ × scale + causal mask)`, exactly what eager "
    "attention computes. With grouped-query attention, several query heads read the same KV head."
)

run = inspection_source(
    "attention", "attention",
    "A chunked run computes the causal matrix in strips: each chunk's rows over every key up to its end.",
    "Run a prompt here, or on the Prefill page: this page then shows that run's attention.",
)
trace, captured = run.trace, run.trace.captured_qk[run.request_id]
num_layers, num_heads = len(captured.queries), captured.queries[0].shape[0]
steps = "one step" if run.num_steps == 1 else f"{run.num_steps} chunks of up to {run.chunk_size} tokens"
st.caption(
    f"Showing {run.source}'s run: {run.num_tokens:,} tokens in {steps} · {trace.model_id} ({trace.device}, "
    f"{trace.dtype}) · maps rebuilt from the inspection pass's captured q/k (stored as {captured.dtype})."
)

# every head at a glance (computed once per run)
cached = st.session_state.get("attention_summaries")
if cached is None or cached[0] is not trace:
    bar = st.progress(0.0, text="Rebuilding every head's attention")
    summaries = inspect_run.attention_summaries(
        run, lambda done, total: bar.progress(done / total, text=f"Layer {done} of {total}")
    )
    bar.empty()
    st.session_state["attention_summaries"] = cached = (trace, summaries)
summaries = cached[1]
for key, size in (("attention_layer", num_layers), ("attention_head", num_heads)):
    if st.session_state.get(key, 0) >= size:  # a run of a smaller model
        st.session_state[key] = 0

st.subheader("Every head: entropy and sink score")
layer, head = st.session_state.get("attention_layer", 0), st.session_state.get("attention_head", 0)
grid = figures.head_grid_figure(summaries, selected=(layer, head))
st.plotly_chart(grid, key="attention_grid", on_select=open_clicked_head, selection_mode="points")
st.caption(
    "Entropy: how spread out a head's attention is (mean over query rows; a uniform row i gives log(i + 1)). "
    "Sink score: mean probability on the first token, where many heads park attention they do not need. "
    "Click a cell to open that head below."
)
downloads(
    "attention_head_summaries",
    "attention_grid_dl",
    figure=grid,
    table=[
        {"layer": layer, "head": h, **{name: float(values[layer, h]) for name, values in summaries.items()}}
        for layer in range(num_layers)
        for h in range(num_heads)
    ],
)

st.subheader("One head's attention map")
pickers = st.columns(3)
layer = pickers[0].selectbox("Layer", range(num_layers), key="attention_layer")
head = pickers[1].selectbox("Head", range(num_heads), key="attention_head")
log_scale = pickers[2].checkbox("Log colour scale", key="attention_log_scale",
                                help="Shows the small probabilities a sink drowns out.")
boundaries = inspect_run.chunk_boundaries(trace, run.request_id)
strips = causal_chunk_strips(boundaries, run.num_tokens) if len(boundaries) > 1 else None
attention_map = figures.attention_map_figure(
    captured.queries[layer], captured.keys[layer], head, captured.scaling[layer], layer, run.token_texts, strips,
    log_scale=log_scale
)
st.plotly_chart(attention_map, key="attention_map")
notes = [f"Layer {layer} scale {captured.scaling[layer]:.4g}."]
if run.num_tokens > 256:
    notes.append("Long prompt: each cell is the largest probability in its "
                 "block of positions (max-pooled), so sharp peaks stay visible.")
if strips:
    notes.append(
        f"Rectangles: the {len(strips)} chunks of this chunked run. Chunk c computed query rows [b_c, b_c+1) against "
        "every key up to its end: the earlier keys from the KV cache, its own causally."
    )
st.caption(" ".join(notes))
heatmap = attention_map.data[0]
downloads(
    f"attention_layer{layer}_head{head}",
    "attention_map_dl",
    figure=attention_map,
    data={
        "layer": layer,
        "head": head,
        "cells": "log10 probability" if log_scale else "probability",
        "labels": list(heatmap.x),  # query rows and key columns (positions, or bins of positions)
        # None: masked (above the diagonal)
        "matrix": [[None if v != v else float(v) for v in row] for row in heatmap.z],
        "chunk_boundaries": boundaries,
    },
)
