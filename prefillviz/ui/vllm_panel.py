""""Run on vLLM too": a page's workload on real vLLM, its schedule drawn next to ours, and a diff.

vLLM runs in its worker process (``peers.vllm_client``), started once per app process and
shared by the sessions (their runs take turns, as on our model). The comparison runs our
engine again at vLLM's block size (32, its CPU attention's multiple), so the two runs differ
only in the engine.
"""

from __future__ import annotations

from collections.abc import Callable

import plotly.graph_objects as go
import streamlit as st

from prefillviz import bundled
from prefillviz.devices import dtype_name
from prefillviz.model_registry import BUNDLED_MODEL_ID
from prefillviz.instrument.trace import Trace
from prefillviz.models import LoadedModel
from prefillviz.peers import side_by_side
from prefillviz.peers.vllm_client import BLOCK_SIZE, PeerRequest, VLLMWorker, unavailable_reason
from prefillviz.ui.shell import get_result, run_guarded, save_result

POLICY_NOTE = (
    "Where the schedules part: vLLM's scheduler (`vllm/v1/core/sched/scheduler.py`, `schedule`) first walks its "
    "running requests in arrival order, giving each what it still needs (a decode token, or the rest of a prompt "
    "chunk) while the budget lasts, then admits waiting requests in arrival order. Ours schedules every decode "
    "first, then prompt chunks in arrival order. The two agree whenever the requests that were running first are "
    "the decoding ones, as in this page's workloads; a running prompt chunk ahead of a decode is where they differ."
)


@st.cache_resource(show_spinner=False, max_entries=1)
def _worker(dtype: str) -> VLLMWorker:
    return VLLMWorker(bundled.bundled_cache_dir(), dtype=dtype)


def _why_not(loaded: LoadedModel) -> str | None:
    reason = unavailable_reason()
    if reason is None and loaded.model_id != BUNDLED_MODEL_ID:
        reason = "The vLLM comparison runs the bundled model (vLLM loads its safetensors copy): pick it in the sidebar."
    if reason is None and loaded.device.type != "cpu":
        reason = "The vLLM comparison runs on a CPU here (its CUDA build is `make vllm` on a GPU machine)."
    return reason


def vllm_panel(page: str, loaded: LoadedModel, requests: list[PeerRequest], token_budget: int, figure: Callable[[Trace, Trace, str], go.Figure]) -> None:
    """The button, the run on vLLM, the diff, and ``figure(ours, vLLM's, title)`` of the two runs."""
    st.subheader("The same workload on real vLLM")
    reason = _why_not(loaded)
    if reason:
        st.info(reason, icon=":material/info:")
        return
    if st.button("Run on vLLM too", key=f"{page}_vllm_run", help="Starts vLLM once per app process (10-25 s), then runs this workload on it"):
        with run_guarded("The vLLM run"):
            with st.spinner("Starting vLLM (once per app process) and running the workload…"):
                theirs = _worker(dtype_name(loaded.dtype)).run(requests, token_budget)
            ours = side_by_side.run_ours(loaded.model, loaded.tokenizer, requests, token_budget, model_id=loaded.model_id)
            save_result(f"{page}_vllm", {"ours": ours, "theirs": theirs, "comparison": side_by_side.compare(ours, theirs)})
    result = get_result(f"{page}_vllm")
    if result is None:
        st.caption("vLLM runs the same token ids, greedy, at block size 32; the diff compares outputs, prefix hits and the schedule.")
        return
    comparison, ours, theirs = result["comparison"], result["ours"], result["theirs"]
    (st.success if comparison.all_equal else st.warning)(
        f"Against {theirs.engine_config['engine']}: {comparison.summary()}.", icon=":material/compare_arrows:"
    )
    st.plotly_chart(figure(ours, theirs, f"vLLM: {theirs.num_steps} steps (its own SchedulerOutput, every step)"), key=f"{page}_vllm_figure")
    st.caption(
        f"vLLM {theirs.engine_config['engine'].split()[-1]} on {theirs.device}, {theirs.dtype}, block size {BLOCK_SIZE}, "
        f"token budget {token_budget}; ours run again at block size {BLOCK_SIZE} for the diff. vLLM's step times are "
        "the wall time of its `LLMEngine.step` (schedule, forward, sample, outputs)."
    )
    if not comparison.schedule_equal:
        st.markdown(POLICY_NOTE)
