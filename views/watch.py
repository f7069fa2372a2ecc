"""Watch it happen: prefill, chunked prefill and a prefix hit played back from their recorded runs."""

import streamlit as st
import streamlit.components.v1 as components

from prefillviz.experiments.replay_runs import MAX_REPLAY_TOKENS, MIN_REPLAY_TOKENS, record_replay
from prefillviz.figures.replay.build import replay_payload
from prefillviz.figures.replay.page import replay_html
from prefillviz.loading.hosted import hosted_policy
from prefillviz.ui.presenter import presenter_mode
from prefillviz.ui.results import get_result, save_result
from prefillviz.ui.running import progress_bar, run_guarded
from prefillviz.ui.shell import page_frame, run_button, stop_page

loaded = page_frame()

st.title("Watch it happen")
st.markdown(
    "Every other page shows a finished run. Here the run plays back: **every frame is one event the engine "
    "recorded** (a scheduler step, one layer writing its keys and values into the KV cache, a sampled token), "
    "shown at the time it was measured or one per tick in step order. Nothing between two events is drawn. "
    "Three scenes: the same prompt as **one prefill step** and **token by token**, **chunked prefill** beside "
    "decoding requests, and a **prefix-cache hit**. Point at a token to light its K/V slots in every layer, "
    "its block, its chunk, and its row and column in the prefill step's **attention map** (one head of the "
    "first, middle or last layer); point at a block to light its tokens, at a map cell to light its query and "
    "its key."
)
largest = hosted_policy().limit("prompt_tokens", MAX_REPLAY_TOKENS)
num_tokens = st.slider("Prompt tokens", MIN_REPLAY_TOKENS, min(largest, MAX_REPLAY_TOKENS), min(128, largest),
                       key="watch_tokens",
                       help="The prefill runs' prompt and the chunked run's long prompt. Token by token runs one "
                       "step per token, so a long prompt takes a while to record.")

if run_button("Record the three runs", type="primary", key="watch_run"):
    with run_guarded("Recording the replay"), progress_bar("Recording") as progress:
        runs = record_replay(loaded, num_tokens, progress)
        payload = replay_payload(runs)
        save_result("watch", {"payload": payload, "record_s": runs.record_s})

result = get_result("watch")
if result is None:
    st.caption("Press the button: the page runs the model three ways and then plays what it recorded.")
    stop_page()

payload = result["payload"]
document = replay_html(payload, presenter=presenter_mode())
st.caption(
    f"{payload['num_frames']:,} recorded events · {payload['model_id']} on {payload['device']}, {payload['dtype']} · "
    f"recorded in {result['record_s']:.1f} s. The prefill scene comes from inspection passes (KV write log and "
    "per-layer clocks, slower than a timing pass), its attention maps from the q/k that pass captured; the "
    "chunked and prefix scenes from timing passes."
)
components.html(document, height=1250 if presenter_mode() else 980, scrolling=True)
if not presenter_mode():
    st.download_button(
        "Download the replay (one HTML file, plays offline)", document, f"prefill_replay_{payload['num_tokens']}.html",
        "text/html", key="watch_download", on_click="ignore",
    )
