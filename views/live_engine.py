"""Live engine: a running ``prefillviz serve`` under your own traffic, step by step, from the engine's own record."""

import streamlit as st

from prefillviz.engine.errors import ProbeError
from prefillviz.figures import live_engine as figures
from prefillviz.loading.hosted import hosted_policy
from prefillviz.probe.live import fetch_live, recording_cost
from prefillviz.ui.results import figure_section
from prefillviz.ui.shell import page_frame, stop_page

FOLLOW_EVERY_S = 2.0

page_frame()  # the sidebar; the server has its own model

st.title("Live engine: your own traffic, scheduled step by step")
st.markdown(
    "`make serve` (or `python -m prefillviz serve`) puts this app's engine behind an **OpenAI-compatible server** on "
    "http://127.0.0.1:8000. Point what you measure servers with at it — `vllm bench serve --backend openai`, the "
    "OpenAI SDK, any OpenAI-compatible client — and this page shows what its scheduler did with *your* requests: "
    "which prefill chunks rode with which decodes in each step's token budget, how many KV blocks were in use and "
    "which were prefix-cache hits, and for each finished request where its time to first token went."
)
with st.expander("Start a server and send it traffic"):
    st.code("make serve    # or: python -m prefillviz serve --port 8000\n"
            "vllm bench serve --backend openai --base-url http://127.0.0.1:8000 \\\n"
            "    --model bundled:SmolLM2-135M-Instruct --tokenizer HuggingFaceTB/SmolLM2-135M-Instruct \\\n"
            "    --dataset-name random --random-input-len 256 --random-output-len 32 --num-prompts 100 "
            "--request-rate 2", language="bash")

policy = hosted_policy()
if policy.enabled and not policy.allowed_probe_urls:
    st.info("Reading a server is off in this hosted demo (a public page that fetched any URL would reach the host's "
            "network). Run prefillviz on your own machine, with `make serve`, to watch yours.")
    stop_page()
if policy.enabled:
    url = st.selectbox("Server URL (this demo's allow-list)", policy.allowed_probe_urls, key="live_url")
else:
    url = st.text_input("Server URL", value="http://127.0.0.1:8000", key="live_url",
                        help="a running `python -m prefillviz serve`")
follow = st.toggle(f"Follow live (every {FOLLOW_EVERY_S:.0f} s)", value=False, key="live_follow")


def draw() -> None:
    try:
        snapshot = fetch_live(url)
    except ProbeError as error:
        st.error(str(error))
        return
    finished = [r for r in snapshot["requests"] if r.get("ttft_s") is not None]
    row = st.columns(4)
    row[0].metric("Steps run", f"{snapshot['num_steps']:,}")
    row[1].metric("Token budget", f"{snapshot['token_budget']:,}")
    last = snapshot["steps"][-1] if snapshot["steps"] else None
    row[2].metric("KV blocks in use", f"{last['blocks_in_use'] if last else 0} / {snapshot['num_blocks']:,}")
    row[3].metric("Finished requests shown", len(finished))
    if not snapshot["steps"]:
        st.info("The server has not run a step yet: send it a request.")
        return
    figure_section("Each step's token budget", "A bar is one step; each segment one request's tokens in it, in the "
                   "request's colour: above, its prefill chunks; below, its decode tokens (one each), on a scale of "
                   "their own. Decodes go first; prefill chunks fill what is left of the budget.",
                   figures.step_budget_figure(snapshot), key="live_budget")
    figure_section("KV blocks", "Blocks held by running requests after each step, and the blocks a step found in the "
                   "prefix cache instead of computing them.", figures.kv_blocks_figure(snapshot), key="live_blocks")
    if finished:
        figure_section("Where each time to first token went",
                       "From the server's arrival to the first token, on the engine's own clock: waiting in the queue, "
                       "the steps that ran its prompt (beside other requests' decodes), steps it sat out, and the "
                       "loop's own work between steps. The parts add up to the TTFT.",
                       figures.ttft_split_figure(snapshot), key="live_split")
    st.caption(recording_cost(snapshot).sentence())


if follow:
    st.fragment(draw, run_every=FOLLOW_EVERY_S)()
else:
    st.button("Refresh", key="live_refresh")
    draw()
