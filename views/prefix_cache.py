"""Prefix cache: a stream of requests sharing a prefix, their block hits, hit rate, TTFT and evictions."""

import streamlit as st

from prefillviz.experiments.outputs import compare_outputs
from prefillviz.experiments.prefix import (
    OTHER_REQUEST_ID,
    QUESTIONS,
    SHARED_PREFIXES,
    build_stream,
    estimated_num_steps,
    run_prefix_experiment,
)
from prefillviz.figures import prefix as figures
from prefillviz.loading.hosted import hosted_policy
from prefillviz.peers.vllm_client import BLOCK_SIZE as VLLM_BLOCK_SIZE
from prefillviz.peers.workload import PeerRequest
from prefillviz.ui.output_checks import same_tokens_block
from prefillviz.ui.results import downloads, figure_section, get_result, save_result
from prefillviz.ui.running import progress_callback, run_guarded, run_label
from prefillviz.ui.shell import page_frame, run_button, stop_page
from prefillviz.ui.vllm_panel import vllm_panel

loaded = page_frame()

st.title("Prefix cache: compute a shared prefix once")
st.markdown(
    "Many requests start the same way: a chat app's system prompt, a document several questions are asked about. "
    "The engine hashes every **full** KV block of a prompt, chained through the blocks before it. A later request "
    "whose leading blocks hash the same **hits** them: their keys and values are reused, and its prefill starts "
    "after them. The requests below run **one after another on one engine**, on the real model, greedy."
)


preset = st.selectbox("Shared prefix", list(SHARED_PREFIXES), key="prefix_preset")
prefix_text, turn_template = SHARED_PREFIXES[preset]
shared_prefix = st.text_area("Every request starts with", prefix_text, height=140, key=f"prefix_text_{preset}")
questions = st.text_area("Then each request's own turn (one per line)", "\n".join(QUESTIONS), height=120,
                         key="prefix_questions")
row = st.columns(3)
block_size = row[0].number_input("Block size (tokens)", value=16, step=1, key="prefix_block_size",
                                 help=f"vLLM's default on a CUDA GPU is 16; its CPU backend's is 128 (vLLM 0.32.0, "
                                 f"`vllm/platforms/cpu.py`), and the vLLM run on this page uses {VLLM_BLOCK_SIZE}, "
                                 "a multiple of 32 as its CPU attention prefers.")
max_new_tokens = row[1].slider("New tokens per request", 1, 16, 6, key="prefix_new_tokens")
other_user = row[2].checkbox(f"Another user's request ({OTHER_REQUEST_ID!r}) after q2", True, key="prefix_other_user")
row = st.columns(2)
small_cache = row[0].checkbox("Also run in a small KV cache (evictions)", True, key="prefix_small_cache")
small_blocks = row[1].number_input(
    "Small cache size (blocks; 0 = the smallest that fits every request)", value=0, min_value=0, step=1,
    key="prefix_small_blocks"
)

if run_button("Run the stream", type="primary", key="prefix_run"):
    with run_guarded("The prefix-cache run"):
        stream = build_stream(
            loaded.tokenizer, shared_prefix,
            [q for q in questions.splitlines() if q.strip()][: hosted_policy().limit("requests_per_workload", 10**6)],
            turn_template, max_new_tokens, int(block_size),
            other_user_after=2 if other_user else None,
        )
        num_blocks = (int(small_blocks) or stream.min_num_blocks) if small_cache else None
        progress = progress_callback(estimated_num_steps(stream, small_cache),
                                     "Cache on, cache off" + (", small cache" if small_cache else ""))
        experiment = run_prefix_experiment(loaded.model, stream, num_blocks, progress, loaded.model_id)
        save_result("prefix", {"experiment": experiment, "label": f"{run_label(loaded, 'none')}"})

result = get_result("prefix")
if result is None:
    stop_page()

experiment, label = result["experiment"], result["label"]
stream, on, off, small = experiment.stream, experiment.cache_on, experiment.cache_off, experiment.small_cache
same_model = loaded is not None and loaded.model_id == experiment.model_id
st.caption(
    f"Last run: {len(stream.prompts)} requests; shared prefix {stream.num_shared_prefix_tokens} tokens = "
    f"{stream.num_shared_full_blocks} full block(s) of {stream.block_size} + "
    f"{stream.num_shared_prefix_tokens % stream.block_size} token(s) that share a block with each request's own turn; "
    f"{stream.max_new_tokens} new token(s) each. All times: {label}."
)

queries, hits = on.counters[-1]
first_queries, first_hits = on.counters[0]  # after the first request, which meets a cold cache
later_queries, later_hits = queries - first_queries, hits - first_hits
columns = st.columns(4)
columns[0].metric("prefix_cache_queries (tokens)", f"{queries:,}")
columns[1].metric("prefix_cache_hits (tokens)", f"{hits:,}")
columns[2].metric("Hit rate over the stream", f"{100 * hits / queries:.0f}%",
                  help="All requests, the first included: it meets a cold cache")
columns[3].metric(
    "Hit rate after the first request",
    f"{100 * later_hits / later_queries:.0f}%" if later_queries else "n/a",
    help="Requests 2 onwards: what a warm cache gives",
)
st.caption(
    f"The stream's hit rate counts the first request, which finds nothing ({first_hits:,} of {first_queries:,} "
    "tokens): the cache starts cold. The requests after it are what a warm cache serves."
)


def block_text(run):
    if not same_model:
        return None

    def text(request_id: str, index: int) -> str:
        ids = run.trace.requests[request_id].prompt_token_ids[
            index * stream.block_size : (index + 1) * stream.block_size
        ]
        return repr(loaded.tokenizer.decode(ids)).replace("<", "&lt;")

    return text


st.subheader("Each request's blocks")
st.markdown(
    "One row per request, one cell per block of its prompt: **green** = hit (K/V reused), **blue** = computed, "
    "**light blue** = partial (the prompt ends inside it, so it has no hash yet). Cell labels are physical block ids."
)
for run in [r for r in (on, small) if r is not None]:
    blocks = [run.request_blocks(rid) for rid in stream.request_ids]
    title = f"Blocks, {run.label} ({run.num_blocks:,} blocks of {stream.block_size} tokens)"
    grid = figures.block_grid_figure(blocks, stream.block_size, title, block_text(run))
    st.plotly_chart(grid, key=f"prefix_blocks_{run.label.replace(' ', '_')}")
    downloads(
        f"prefix_blocks_{run.label.replace(' ', '_')}", f"prefix_blocks_{run.label.replace(' ', '_')}_dl", figure=grid,
        table=[
            {"request": b.request_id, "block": i, "physical block": p, "status": s}
            for b in blocks
            for i, (p, s) in enumerate(zip(b.physical_blocks, b.statuses))
        ],
    )

st.subheader("Hit rate over the stream")
hit_rows = figures.hit_rate_rows(on)
hit_rate = figures.hit_rate_figure(on, "Prefix-cache hits per request, and vLLM's counters (cache on)")
st.plotly_chart(hit_rate, key="prefix_hit_rate")
st.dataframe(
    hit_rows, hide_index=True,
    column_config={"hit rate (cumulative, %)": st.column_config.NumberColumn(format="%.1f")}, key="prefix_hit_table"
)
downloads("prefix_hit_rate", "prefix_hit_rate_dl", figure=hit_rate, table=hit_rows)

st.subheader("Time to first token: hits vs misses")
ttft_rows = figures.ttft_rows(experiment)
ttft = figures.ttft_figure(experiment, "Time to first token per request (ms)")
st.markdown(
    "A hit skips the prefix's forward pass, so TTFT falls with the number of tokens still to compute. The first "
    "request always misses; with the cache off every request pays for the whole prompt."
)
st.plotly_chart(ttft, key="prefix_ttft")
downloads("prefix_ttft", "prefix_ttft_dl", figure=ttft, table=ttft_rows)

if small is not None:
    evictions = figures.eviction_figure(small, "Cached blocks evicted per step, and free blocks (small cache)")
    figure_section(
        f"A small cache: {small.num_blocks} blocks",
        "A freed block keeps its K/V and its hash until the block is handed out again: allocation takes the **least "
        "recently freed** block first and **evicts** what it held. A request's blocks are freed tail first, so its "
        "shared prefix is the last to go, but a long request from another user can still push it out.",
        evictions, "prefix_evictions",
    )
    downloads("prefix_evictions", "prefix_evictions_dl", figure=evictions, table=figures.eviction_rows(small))
    lost = [
        {"request": rid, "cached tokens, ample cache": ample, "cached tokens, small cache": tight,
         "lost hits (tokens)": ample - tight}
        for rid, ample, tight in experiment.lost_hits()
    ]
    st.dataframe(lost, hide_index=True, key="prefix_lost_table")
    losers = [row["request"] for row in lost if row["lost hits (tokens)"] > 0]
    st.markdown(
        f"**Lost their hits:** {', '.join(losers)}." if losers
        else "**No request lost a hit**: the evicted blocks were not needed again."
    )

# each request arrives when the one before is done
arrivals = {rid: steps[0] for rid, steps in on.request_steps.items()}
peer_requests = [PeerRequest(rid, list(prompt), stream.max_new_tokens, arrival_step=arrivals[rid])
                 for rid, prompt in stream.prompts]
vllm_panel(
    "prefix", loaded, {"cache on": (peer_requests, on.trace.engine_config["token_budget"], 0)},
    lambda runs: figures.cached_tokens_figure(runs[0].ours, runs[0].theirs,
                                              "Prompt tokens from the prefix cache: ours and vLLM's (block size 32)"),
)

st.subheader("Same tokens with and without the cache")
checks = [(run.label, check) for run in experiment.runs if run is not off
          for check in compare_outputs(off.trace, run.trace)]
# token ids when another model is loaded now
shown = (lambda ids: repr(loaded.tokenizer.decode(ids))) if same_model else str
same_tokens_block(
    checks,
    shown,
    ("cache off", "this run"),
    "prefix_output_table",
    f"Identical outputs: every request generated the same tokens as with the cache off ({len(checks)} checks).",
    f"Computing a prompt in different pieces (cached blocks + the rest, vs all of it) rounds differently, and in "
    f"{experiment.dtype} that was enough to flip a near-tie between the top two tokens. "
    "float32 (sidebar) makes this much rarer.",
)
