"""KV cache: what prefill writes, layer by layer, into which blocks, and how much memory it takes."""

import streamlit as st

from prefillviz.experiments import inspect_run, kv_memory
from prefillviz.experiments.inspect_run import KV_QUANTITIES
from prefillviz.figures import kv_cache as figures
from prefillviz.ui.inspection_source import inspection_source
from prefillviz.ui.results import downloads
from prefillviz.ui.shell import page_frame

page_frame()

st.title("KV cache: what prefill leaves behind")
st.markdown(
    "While it reads the prompt, every layer computes a **key** and a **value** vector per KV head for every "
    "token and writes them into the paged KV cache: fixed blocks of 16 token slots, handed out by the block "
    "pool. Decode later reads them instead of recomputing the prompt. Everything below comes from the "
    "engine's **KV write log** and block allocations of a real run (inspection pass)."
)

run = inspection_source(
    "kv_cache", "kv",
    "A chunked run gives the engine this token budget per step, so the prompt is written in several steps.",
    "Run a prompt here, or on the Prefill page: this page then shows that run's KV cache.",
)
trace, request_id = run.trace, run.request_id
steps = "one step" if run.num_steps == 1 else f"{run.num_steps} steps of up to {run.chunk_size} tokens"
st.caption(
    f"Showing {run.source}'s run: {run.num_tokens:,} tokens in {steps} · {trace.model_id} ({trace.device}, "
    f"{trace.dtype}) · inspection pass (KV write log, q/k captured; slower than the timing pass)."
)

st.subheader("What each layer wrote, per position")
quantity = st.radio("Colour by", list(KV_QUANTITIES), format_func=KV_QUANTITIES.get, key="kv_quantity", horizontal=True)
heatmap = figures.kv_writes_heatmap(trace, request_id, quantity, run.token_texts)
st.plotly_chart(heatmap, key="kv_heatmap")
st.caption(
    "Norms are the L2 norms of the post-RoPE key / value vectors as written to the cache, averaged over the KV heads. "
    "Bytes are the same for every cell: K and V of every KV head, in the cache's dtype."
)
downloads(f"kv_writes_{quantity}", "kv_heatmap_dl", figure=heatmap,
          table=inspect_run.kv_write_table(trace, request_id, quantity))

st.subheader("The block table")
usage = kv_memory.block_usage(trace, request_id, run.num_tokens)
st.plotly_chart(figures.block_table_figure(usage), key="kv_blocks")
st.caption(
    f"The request's {run.num_tokens:,} positions need ⌈{run.num_tokens} / {usage.block_size}⌉ = {len(usage.block_ids)} "
    f"blocks (block table {usage.block_ids[:12]}{' …' if len(usage.block_ids) > 12 else ''}); the last holds "
    f"{usage.tokens_in_block[-1]} of {usage.block_size} slots. The cache has {usage.num_blocks:,} blocks in all. "
    f"Once the first token was sampled the request finished and its blocks went back to the free queue "
    f"({usage.num_free_after_run:,} free after the run); full blocks keep their hash so a later prompt with "
    "the same prefix can reuse them."
)
downloads(
    "kv_block_table",
    "kv_blocks_dl",
    table=[
        {"logical_block": i, "physical_block": b, "tokens": t, "block_size": usage.block_size}
        for i, (b, t) in enumerate(zip(usage.block_ids, usage.tokens_in_block))
    ],
)

st.subheader("Memory grows with every token")
report = kv_memory.memory_report(run)
growth = kv_memory.memory_growth(trace, request_id)
chart, formula = st.columns([3, 2])
growth_figure = figures.memory_growth_figure(growth)
chart.plotly_chart(growth_figure, key="kv_growth")
formula.markdown(
    "**bytes = 2 × layers × kv_heads × head_dim × bytes/elem × tokens**\n\n"
    f"= 2 × {report.num_layers} × {report.num_kv_heads} × {report.head_dim} × {report.dtype_bytes} B × tokens  \n"
    f"= **{report.bytes_per_token:,} B per token** ({report.dtype})\n\n"
    f"For {run.num_tokens:,} tokens: {report.total_bytes:,} B. The write log measured "
    f"**{int(growth.bytes_written[-1]):,} B**. The engine reserves whole blocks of {usage.block_size} tokens "
    f"({report.bytes_per_block:,} B each): {int(growth.bytes_reserved[-1]):,} B.\n\n"
    f"The whole paged cache was allocated up front: {report.cache_num_bytes:,} B = "
    f"{report.num_blocks:,} blocks = {report.capacity_tokens:,} token slots."
)
downloads(
    "kv_memory_growth",
    "kv_growth_dl",
    figure=growth_figure,
    table=[
        {"tokens": int(t), "bytes_written": float(w), "bytes_reserved": int(r),
         "formula_bytes": int(t) * report.bytes_per_token}
        for t, w, r in zip(growth.tokens, growth.bytes_written, growth.bytes_reserved)
    ],
)

st.subheader("Grouped-query attention shrinks the cache")
bars = figures.gqa_bars_figure(report)
st.plotly_chart(bars, key="kv_gqa")
st.caption(
    f"{report.num_heads} query heads share {report.num_kv_heads} KV heads ({report.num_heads // report.num_kv_heads} "
    f"each), so the cache is {report.gqa_saving_factor:g}x smaller than with one KV head per query head (MHA): "
    f"{report.total_bytes:,} B instead of {report.mha_bytes_per_token * run.num_tokens:,} B for this prompt."
)
downloads(
    "kv_gqa_vs_mha",
    "kv_gqa_dl",
    figure=bars,
    data={
        "formula": report.formula,
        "bytes_per_token": report.bytes_per_token,
        "mha_bytes_per_token": report.mha_bytes_per_token,
        "gqa_saving_factor": report.gqa_saving_factor,
    },
)
