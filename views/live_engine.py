"""Live engine: a running ``prefillviz serve`` under your own traffic, step by step, from the engine's own record."""

import streamlit as st

from prefillviz.engine.errors import PrefillVizError, ProbeError
from prefillviz.figures import live_engine as figures
from prefillviz.loading.hosted import hosted_policy
from prefillviz.probe.live import fetch_live, recording_cost
from prefillviz.ui.classroom import current_room, member_label, room_live_url, share_live_url
from prefillviz.ui.results import figure_section
from prefillviz.ui.send_panel import send_form, sends_list, session_sends
from prefillviz.ui.shell import page_frame, stop_page

FOLLOW_EVERY_S = 2.0

page_frame()  # the sidebar; the server has its own model

st.title("Live engine: your own traffic, scheduled step by step")
st.markdown(
    "`make serve` (or `python -m prefillviz serve`) puts this app's engine behind an **OpenAI-compatible server** on "
    "http://127.0.0.1:8000. Point what you measure servers with at it — `vllm bench serve --backend openai`, the "
    "OpenAI SDK, any OpenAI-compatible client — and this page shows what its scheduler did with *your* requests: "
    "which prefill chunks rode with which decodes in each step's token budget, how many KV blocks were in use and "
    "which were prefix-cache hits, and for each finished request where its time to first token went. Or type a "
    "prompt below and **Send** it; in a class room (Guided lessons) every student's Send goes into the teacher's "
    "server, and everyone sees the whole class's requests in the schedule."
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
here = current_room()
try:
    shared_url = room_live_url(here)  # a student's page reads the teacher's server
except PrefillVizError as error:
    st.error(f"Your class room's server can't be read here: {error}")
    shared_url = None
if shared_url is not None:
    url = shared_url
    st.info(f"Class room {here.code}: this page reads your teacher's server, {url}.")
else:
    if here is not None and not here.teacher:
        st.caption(f"Class room {here.code}: your teacher has not opened this page yet; until then it reads the URL "
                   "below.")
    if policy.enabled:
        url = st.selectbox("Server URL (this demo's allow-list)", policy.allowed_probe_urls, key="live_url")
    else:
        url = st.text_input("Server URL", value="http://127.0.0.1:8000", key="live_url",
                            help="a running `python -m prefillviz serve`")
    share_live_url(here, url)  # a teacher's page shares it with the room
send_form(url, member_label(here))
follow = st.toggle(f"Follow live (every {FOLLOW_EVERY_S:.0f} s)", value=False, key="live_follow")


def draw() -> None:
    sends_list()
    try:
        snapshot = fetch_live(url)
    except ProbeError as error:
        st.error(str(error))
        return
    own = session_sends().own_request_ids()
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
                   "their own. Decodes go first; prefill chunks fill what is left of the budget. Point at a segment "
                   "for whose request it is; yours are starred and outlined.",
                   figures.step_budget_figure(snapshot, own_ids=own), key="live_budget")
    figure_section("KV blocks", "Blocks held by running requests after each step, and the blocks a step found in the "
                   "prefix cache instead of computing them.", figures.kv_blocks_figure(snapshot), key="live_blocks")
    if finished:
        figure_section("Where each time to first token went",
                       "From the server's arrival to the first token, on the engine's own clock: waiting in the queue, "
                       "the steps that ran its prompt (beside other requests' decodes), steps it sat out, and the "
                       "loop's own work between steps. The parts add up to the TTFT.",
                       figures.ttft_split_figure(snapshot, own_ids=own), key="live_split")
    st.caption(recording_cost(snapshot).sentence())


if follow:
    st.fragment(draw, run_every=FOLLOW_EVERY_S)()
else:
    st.button("Refresh", key="live_refresh")
    draw()
