"""Prefill: one forward pass over the whole prompt, the KV cache it fills, the first token."""

import streamlit as st

from prefillviz.analysis.first_token import first_token_view
from prefillviz.engine.request import SamplingParams
from prefillviz.experiments.prefill import load_prefill_bundle, prefill_bundle, run_prefill
from prefillviz.figures import prefill as figures
from prefillviz.loading.hosted import hosted_policy
from prefillviz.loading.prompts import PRESETS
from prefillviz.machine.devices import dtype_name
from prefillviz.ui.presenter import chart
from prefillviz.ui.results import downloads, get_result, save_result
from prefillviz.ui.running import measured_once, run_guarded, sharing_note, timing_runs_for
from prefillviz.ui.shell import page_frame, run_button, stop_page

loaded = page_frame()

# below this a pass is mostly its fixed cost: tokens/s would measure that cost, not prefill
MEANINGFUL_THROUGHPUT_TOKENS = 64

st.title("Prefill: the whole prompt in one pass")
st.markdown(
    "The model reads every prompt token **at once**: one forward pass computes keys and values for all "
    "positions in every layer, stores them in the KV cache, and ends in one probability distribution over "
    "the next token. The time until that token is the **time to first token (TTFT)**."
)



def use_preset() -> None:
    st.session_state["prefill_prompt"] = PRESETS[st.session_state["prefill_preset"]]


st.selectbox("Preset", list(PRESETS), key="prefill_preset", on_change=use_preset, persist_state="session")
st.session_state.setdefault("prefill_prompt", PRESETS[st.session_state["prefill_preset"]])
prompt = st.text_area("Prompt", height=150, key="prefill_prompt", persist_state="session")  # kept across pages

if run_button("Run prefill", type="primary", key="prefill_run"):
    with run_guarded("The prefill", queue=False), st.spinner("Running a few timing passes, then an inspection pass…"):
        # identical inputs (model, device, dtype, prompt, settings) are measured once for every session asking
        key = ("prefill page", loaded.model_id, str(loaded.device), dtype_name(loaded.dtype), prompt, "greedy",
               "budget 8192", "timing+inspect")
        shared = measured_once(
            key, lambda others: (others, run_prefill(loaded, prompt, timing_runs=timing_runs_for(others)))
        )
        waiting_behind, result = shared.result
        save_result("prefill", result)
        st.session_state["prefill_sharing"] = {"viewers": shared.viewers, "joined": shared.joined,
                                               "waiting_behind": waiting_behind}

with st.expander("Load a saved run (no model needed)"):
    if hosted_policy().enabled:  # Streamlit's uploader fails its XSRF check inside a Space's iframe (hosted.py)
        st.caption("Loading a saved run is off in this hosted demo: "
                   "open the bundle in prefillviz on your own machine (`make run`).")
        bundle = None
    else:
        bundle = st.file_uploader("Run bundle (.zip from “Download this run”)", type=["zip"],
                                  key="prefill_bundle_upload")
    if bundle is not None and st.button("Show this run", key="prefill_bundle_load"):
        with run_guarded("Loading the bundle"):
            save_result("prefill", load_prefill_bundle(bundle.getvalue()))

result = get_result("prefill")
if result is None:
    stop_page()

timing, inspection, request_id = result.timing, result.inspection, result.request_id
record = timing.requests[request_id]
shown_prompt = result.prompt if len(result.prompt) <= 80 else result.prompt[:77] + "…"
st.caption(
    f"Last run: “{shown_prompt}” ({result.num_tokens:,} tokens) on {result.model_id} ({timing.device}, "
    f"{timing.dtype}). Times come from timing passes (per-layer clocks); KV writes from a separate inspection pass."
)

st.subheader(f"{result.num_tokens:,} tokens")
st.markdown(figures.token_chips_html(result.token_texts, result.token_ids), unsafe_allow_html=True)

chart(figures.one_pass_diagram(timing, inspection, request_id, record.first_token_text), key="prefill_diagram")
st.caption("Writes and bytes: inspection pass (KV write log). Forward time: timing pass.")

columns = st.columns(3)
columns[0].metric("Time to first token", f"{result.ttft_s * 1000:,.1f} ms",
                  help="The median timing pass; its spread is below")
throughput = result.num_tokens / sum(step.forward_time_s for step in timing.steps)
if result.num_tokens >= MEANINGFUL_THROUGHPUT_TOKENS:
    columns[1].metric("Prefill throughput", f"{throughput:,.0f} tokens/s",
                      help="Prompt tokens over the median pass's forward time")
else:  # a handful of tokens measures the step's fixed cost, not a rate
    columns[1].metric("Forward pass", f"{sum(step.forward_time_s for step in timing.steps) * 1000:,.1f} ms",
                      help="The median timing pass")
    columns[1].caption(
        f"No tokens/s for {result.num_tokens} tokens: a pass this short is mostly the step's fixed cost (launching "
        f"every layer, reading the weights), so {throughput:,.0f} tokens/s would say more about that cost than about "
        f"prefill speed. It is shown from {MEANINGFUL_THROUGHPUT_TOKENS} tokens on."
    )
columns[2].metric("First token", repr(record.first_token_text))
st.caption(f"TTFT: {result.ttft_label()}.",
           help="Each press runs the timing pass a few times on an already warm model; "
                "a busy machine explains a slow figure.")
sharing = st.session_state.get("prefill_sharing")
if sharing is not None and get_result("prefill") is result:
    st.caption(sharing_note(sharing, len(result.ttft_runs_s)))
ttft = figures.ttft_breakdown_figure(record.ttft_breakdown_s)
chart(ttft, key="prefill_ttft")
downloads("ttft_breakdown", "prefill_ttft_dl", figure=ttft,
          table=[{"part": k, "seconds": v} for k, v in record.ttft_breakdown_s.items()])

st.subheader("The first token")
st.markdown("Change the sampling settings: the distribution is re-sampled "
            "from the logits this run kept, without running the model again.")
controls = st.columns(4)
temperature = controls[0].slider("Temperature", 0.0, 2.0, 0.0, 0.05, key="prefill_temperature", help="0 = greedy")
top_k = controls[1].slider("Top-k (0 = off)", 0, 100, 0, key="prefill_top_k")
top_p = controls[2].slider("Top-p", 0.05, 1.0, 1.0, 0.05, key="prefill_top_p")
seed = controls[3].number_input("Seed", 0, 2**31 - 1, 0, key="prefill_seed")
params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
view = first_token_view(record.first_token_logits, params, None if temperature > 0 else record.output_token_ids[0],
                        seed=int(seed))
same_model = loaded is not None and loaded.model_id == result.model_id
decode = (lambda t: loaded.tokenizer.decode([t])) if same_model else (lambda t: f"id {t}")
distribution = figures.first_token_figure(view, decode)
chart(distribution, key="prefill_distribution")
downloads(
    "first_token_distribution",
    "prefill_distribution_dl",
    figure=distribution,
    table=[{"token_id": t, "token": decode(t), "probability": p}
           for t, p in zip(view.greedy.top_token_ids, view.greedy.top_probs)],
)

st.download_button(
    "Download this run (bundle: traces of both passes, loadable without the model)",
    lambda: prefill_bundle(result),
    "prefillviz_prefill_run.zip",
    "application/zip",
    key="prefill_bundle_download",
    on_click="ignore",
)
