"""The prompt box, run button and run picker shared by the views that draw an inspection run.

The KV cache and Attention pages both show either the Prefill page's last run or a run made
on the page itself (optionally chunked); this draws those controls once for both.
"""

from __future__ import annotations

import streamlit as st

from prefillviz.experiments.inspect_run import InspectionRun, from_prefill_result, run_inspection
from prefillviz.loading.prompts import PRESETS
from prefillviz.ui.results import get_result, save_result
from prefillviz.ui.running import progress_callback, run_guarded
from prefillviz.ui.shell import loaded_model, stop_page

PREFILL_RUN, THIS_PAGE_RUN = "the Prefill page's last run", "a run on this page"


def inspection_source(page: str, prefix: str, chunk_help: str, empty_hint: str) -> InspectionRun:
    """Draw the controls (widget keys start with ``prefix``) and return the run to show.

    The page's own run is kept with ``save_result(page, ...)``.

    Stops the page (``st.stop``) with ``empty_hint`` when there is no run yet.
    """
    loaded = loaded_model()
    prompt = st.text_area("Prompt", PRESETS["Chat with a system prompt"], height=120, key=f"{prefix}_prompt")
    chunk_size = st.number_input(
        "Chunk size (tokens per step; 0 = the whole prompt in one step)", 0, 8192, 0, key=f"{prefix}_chunk_size",
        help=chunk_help
    )
    if loaded is not None and st.button("Run (inspection pass)", type="primary", key=f"{prefix}_run"):
        with (run_guarded("The inspection run"),
              st.spinner("Running the prompt with the inspection capture (KV write log, q/k)…")):
            result = run_inspection(loaded, prompt, int(chunk_size),
                                    lambda steps: progress_callback(steps, "Inspection run"))
            save_result(page, result)
            st.session_state[f"{prefix}_source"] = THIS_PAGE_RUN

    runs = {PREFILL_RUN: from_prefill_result(get_result("prefill")), THIS_PAGE_RUN: get_result(page)}
    runs = {label: run for label, run in runs.items() if run is not None}
    if not runs:
        st.info(empty_hint)
        stop_page()
    label = st.radio("Show", list(runs), key=f"{prefix}_source", horizontal=True) if len(runs) > 1 else next(iter(runs))
    return runs[label]
