"""Chunked prefill: a long prompt arrives while short requests decode; chunking off vs on."""

import streamlit as st

from prefillviz.experiments.budget_sweep import budget_sweep, estimated_sweep_steps
from prefillviz.experiments.chunked import LONG_REQUEST_ID, build_workload, compare_chunking, short_request_id
from prefillviz.figures import chunked as figures
from prefillviz.loading.hosted import hosted_policy
from prefillviz.machine.load import MachineLoad
from prefillviz.peers.workload import PeerRequest
from prefillviz.ui.output_checks import same_tokens_block
from prefillviz.ui.results import downloads, get_result, save_result
from prefillviz.ui.running import progress_callback, run_guarded, run_label
from prefillviz.ui.shell import page_frame, run_button, stop_page
from prefillviz.ui.vllm_panel import vllm_panel
from prefillviz.ui.workload_controls import workload_controls

loaded = page_frame()

st.title("Chunked prefill: a long prompt without stalling everyone else")
st.markdown(
    "A few users are **decoding**, one token per step each. Then a **long prompt** arrives. "
    "The old way (*chunking off*) runs the whole prompt in one prefill-only step: every decoding user waits "
    "for it. With **chunked prefill** (vLLM's default) each step serves the decodes first and fills the rest of "
    "its **token budget** with a chunk of the prompt. Both runs below use the real model on the same tokens, greedy."
)


st.subheader("Workload")
choice = workload_controls(
    "chunked", budget_help="Most tokens one step may run (vLLM's max_num_batched_tokens). "
    "Decodes take 1 each; the long prompt gets the rest."
)
x_axis = st.radio("Timeline x axis", ["time (ms)", "engine step"], horizontal=True, key="chunked_timeline_x")


def workload(token_budget):
    return build_workload(
        loaded.tokenizer, choice.num_short, choice.short_tokens, choice.short_new, choice.long_tokens,
        arrival_step=choice.arrival, token_budget=int(token_budget),
    )


if run_button("Run with chunking off, then on", type="primary", key="chunked_run"):
    with run_guarded("The chunked-prefill run"):
        work = workload(choice.budget)
        total = work.estimated_num_steps(False) + work.estimated_num_steps(True)
        progress = progress_callback(total, "Chunking off, then on")
        with MachineLoad() as load:
            comparison = compare_chunking(loaded.model, work, progress, loaded.model_id)
        save_result("chunked", {"comparison": comparison,
                                "label": f"{run_label(loaded, 'none')} · {load.reading.label()}"})

result = get_result("chunked")
if result is None:
    stop_page()

comparison, label = result["comparison"], result["label"]
work, off, on = comparison.workload, comparison.off, comparison.on
summaries = {"chunking off": comparison.summary_off, "chunking on": comparison.summary_on}
st.caption(
    f"Last run: {len(work.short_prompts)} short request(s) of {len(work.short_prompts[0])} tokens + "
    f"{work.short_max_new_tokens} new; long prompt {len(work.long_prompt):,} tokens arriving at step "
    f"{work.arrival_step}; token budget {work.token_budget}. All times: {label}."
)

columns = st.columns(4)
columns[0].metric("Max ITL, chunking off", f"{summaries['chunking off'].itl_max_ms:,.0f} ms")
columns[1].metric(
    "Max ITL, chunking on", f"{summaries['chunking on'].itl_max_ms:,.0f} ms",
    delta=f"{summaries['chunking on'].itl_max_ms - summaries['chunking off'].itl_max_ms:,.0f} ms",
    delta_color="inverse",
)
columns[2].metric("TTFT of the long prompt, off", f"{summaries['chunking off'].long_ttft_ms:,.0f} ms")
columns[3].metric(
    "TTFT of the long prompt, on", f"{summaries['chunking on'].long_ttft_ms:,.0f} ms",
    delta=f"{summaries['chunking on'].long_ttft_ms - summaries['chunking off'].long_ttft_ms:,.0f} ms",
    delta_color="inverse",
)

st.subheader("Who ran what, step by step")
st.markdown(
    "One row per request, one bar per request and step: **blue** = prompt (prefill) tokens, with their count; "
    "**orange** = one decode token. A gap in an orange row is a step in which that user got no token."
)
axis = "time" if x_axis.startswith("time") else "step"
if axis == "time":
    x_max = max(s.total_ms for s in summaries.values()) * 1.02
else:
    x_max = max(off.num_steps, on.num_steps) - 0.4
for name, trace, summary in [("off", off, summaries["chunking off"]), ("on", on, summaries["chunking on"])]:
    title = (
        f"Chunking {name}: {trace.num_steps} steps, {summary.num_paused_decode_steps} of them paused a decoding request"
    )
    timeline = figures.timeline_figure(trace, title, axis, x_max)
    st.plotly_chart(timeline, key=f"chunked_timeline_{name}")
    chunk_rows = [
        {
            "step": step.step_index, "start (ms)": step.start_time_s * 1000,
            "step wall time (ms)": step.wall_time_s * 1000,
            "request": chunk.request_id, "kind": "prefill" if chunk.is_prefill else "decode",
            "tokens": chunk.num_tokens,
            "first position": chunk.start_position,
        }
        for step in trace.steps
        for chunk in step.chunks
    ]
    downloads(f"chunked_timeline_{name}", f"chunked_timeline_{name}_dl", figure=timeline, table=chunk_rows)

peer_requests = [PeerRequest(short_request_id(i), list(prompt), work.short_max_new_tokens)
                 for i, prompt in enumerate(work.short_prompts)]
peer_requests.append(PeerRequest(LONG_REQUEST_ID, list(work.long_prompt), work.long_max_new_tokens,
                                 arrival_step=work.arrival_step))
# vLLM: the prompt must fit one step
whole_prompt_budget = max(work.token_budget, len(work.long_prompt) + len(work.short_prompts))
vllm_panel(
    "chunked", loaded,
    {
        "chunking off": (peer_requests, whole_prompt_budget, 0, {"chunking": False, "prefix_caching": False}),
        "chunking on": (peer_requests, work.token_budget, 0, {"prefix_caching": False}),
    },
    lambda runs: [
        figures.timeline_figure(
            run.theirs, f"vLLM, {run.label}: {run.theirs.num_steps} steps (its own SchedulerOutput, every step)", "step"
        )
        for run in runs
    ],
)

st.subheader("What the users felt")
st.markdown(
    "**Inter-token latency (ITL)**: the time between two tokens of the same decoding user (all short requests' tokens "
    "pooled). **TTFT**: from the long prompt's arrival to its first token."
)
rows = figures.latency_rows(summaries)
one_decimal = {name: st.column_config.NumberColumn(format="%.1f") for name in rows[0] if name.endswith("(ms)")}
st.dataframe(rows, hide_index=True, column_config=one_decimal, key="chunked_latency_table")
latency = figures.latency_figure(summaries, "Latency: chunking off vs on (ms)")
st.plotly_chart(latency, key="chunked_latency")
downloads("chunked_latency", "chunked_latency_dl", figure=latency, table=rows)

st.subheader("Same tokens either way")
checks = comparison.output_checks
same_model = loaded is not None and loaded.model_id == comparison.model_id
# token ids when another model is loaded now
shown = (lambda ids: repr(loaded.tokenizer.decode(ids))) if same_model else str
same_tokens_block(
    [("", check) for check in checks],
    shown,
    ("chunking off", "chunking on"),
    "chunked_output_table",
    f"Identical outputs: all {len(checks)} requests generated the same tokens with chunking off and on.",
    f"Computing a prompt in chunks rounds differently from one pass, and in {comparison.dtype} that was enough to flip "
    "a near-tie between the top two tokens. float32 (sidebar) makes this much rarer.",
)

st.subheader("The token budget trade-off")
st.markdown(
    "A smaller budget gives the decoding users shorter steps (lower ITL) but spreads the long prompt over more "
    "steps (higher TTFT). The sweep reruns the workload above "
    "with chunking on at each budget, plus once with chunking off."
)
budgets = st.multiselect("Token budgets", [16, 32, 64, 128, 256, 512, 1024, 2048], [32, 64, 128, 256],
                         max_selections=hosted_policy().limit("sweep_points", 64), key="chunked_sweep_budgets")
if run_button("Run the budget sweep", key="chunked_sweep_run"):
    with run_guarded("The budget sweep"):
        if not budgets:
            st.error("Pick at least one token budget for the sweep.")
        else:
            work = workload(choice.budget)
            progress = progress_callback(estimated_sweep_steps(work, budgets), "Budget sweep")
            sweep = budget_sweep(loaded.model, work, budgets, progress, loaded.model_id)
            save_result("chunked_sweep", {"sweep": sweep, "label": f"{run_label(loaded, 'none')}"})

saved = get_result("chunked_sweep")
if saved is not None:
    sweep = saved["sweep"]
    figure = figures.sweep_figure(sweep, "Max ITL vs TTFT of the long prompt, per token budget (ms)")
    st.plotly_chart(figure, key="chunked_sweep")
    st.caption(f"Sweep of {len(sweep.points) - 1} budget(s) on the long prompt of "
               f"{len(sweep.workload.long_prompt):,} tokens · {saved['label']}.")
    sweep_rows = figures.sweep_rows(sweep)
    one_decimal = {name: st.column_config.NumberColumn(format="%.1f")
                   for name in sweep_rows[0] if name.endswith("(ms)")}
    st.dataframe(sweep_rows, hide_index=True, column_config=one_decimal, key="chunked_sweep_table")
    downloads("chunked_budget_sweep", "chunked_sweep_dl", figure=figure, table=sweep_rows)
