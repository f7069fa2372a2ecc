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

from prefillviz.experiments.prefix import request_blocks
from prefillviz.figures.prefix import block_grid_figure
from prefillviz.loading import bundled
from prefillviz.loading.models import LoadedModel
from prefillviz.machine.devices import dtype_name
from prefillviz.peers import side_by_side
from prefillviz.peers.vllm_client import BLOCK_SIZE, VLLMWorker, unavailable_for
from prefillviz.ui.results import get_result, save_result
from prefillviz.ui.running import run_guarded

POLICY_NOTE = (
    "Where the schedules part: vLLM's scheduler (`vllm/v1/core/sched/scheduler.py`, `schedule`) first walks its "
    "running requests in arrival order, giving each what it still needs (a decode token, or the rest of a prompt "
    "chunk) while the budget lasts, then admits waiting requests in arrival order. Ours schedules every decode "
    "first, then prompt chunks in arrival order. The two agree whenever the requests that were running first are "
    "the decoding ones, as in this page's workloads; a running prompt chunk ahead of a decode is where they differ. "
    "**With chunking off** ours runs the old way (vLLM V0's): a step with a new prompt is prefill-only, so the "
    "decodes wait a step. vLLM V1 has no prefill-only steps: chunking off only means a waiting prompt is admitted "
    "whole or not at all (`enable_chunked_prefill`), and the running decodes still share its step."
)
BLOCK_MAP_NOTE = (
    "Block maps: the same statuses (hit, computed, partial) and as many blocks per request on both; the physical ids "
    "differ, since vLLM's block 0 is its null block and its free queue's order carries over from the worker's earlier "
    "runs. vLLM's map is read from its own `kv_cache_manager` after every schedule."
)


@st.cache_resource(show_spinner=False, max_entries=1)
def _cached_worker(dtype: str) -> VLLMWorker:
    return VLLMWorker(bundled.bundled_cache_dir(), dtype=dtype)


def _worker(dtype: str) -> VLLMWorker:
    """The app process's vLLM worker for this dtype, started again if it has died or was stopped."""
    worker = _cached_worker(dtype)
    if not worker.alive:
        _cached_worker.clear()
        worker = _cached_worker(dtype)
    return worker


def vllm_panel(
    page: str,
    loaded: LoadedModel,
    workloads: dict[str, tuple],
    figure: Callable[[list[side_by_side.PeerRun]], go.Figure | list[go.Figure]],
) -> None:
    """The button, the runs on vLLM, a diff per workload, ``figure(runs)`` of them, and both block maps.

    Args:
        workloads: label -> (requests, token budget, timed runs[, options]); each runs on both
            engines. Timed runs 0: one run each (the schedule and hits are what is compared);
            otherwise a warm-up and that many alternated runs, whose first request's TTFTs are
            kept. Options: ``chunking`` and ``prefix_caching`` (both on by default).
    """
    st.subheader("The same workload on real vLLM")
    reason = unavailable_for(loaded.model_id, loaded.device.type)
    if reason:
        st.info(reason, icon=":material/info:")
        return
    if st.button("Run on vLLM too", key=f"{page}_vllm_run",
                 help="Starts vLLM once per app process (10-25 s), then runs this workload on it"):
        with run_guarded("The vLLM run"):
            with st.spinner("Starting vLLM (once per app process) and running the workload on both engines…"):
                worker = _worker(dtype_name(loaded.dtype))
                runs = [
                    side_by_side.run_both(loaded, worker, label, *workload[:3],
                                          **(workload[3] if len(workload) > 3 else {}))
                    for label, workload in workloads.items()
                ]
            save_result(f"{page}_vllm", runs)
    runs = get_result(f"{page}_vllm")
    if runs is None:
        st.caption("vLLM runs the same token ids, greedy, at block size 32; "
                   "the diff compares outputs, prefix hits and the schedule.")
        return
    engine = runs[0].theirs.engine_config["engine"]
    for run in runs:
        where = f"{run.label}: " if len(runs) > 1 else ""
        (st.success if run.comparison.all_equal else st.warning)(
            f"{where}against {engine}: {run.comparison.summary()}.", icon=":material/compare_arrows:"
        )
    drawn = figure(runs)
    for index, one in enumerate(drawn if isinstance(drawn, list) else [drawn]):
        st.plotly_chart(one, key=f"{page}_vllm_figure_{index}")
    block_maps(page, runs[0])
    timing = "; ".join(
        f"{run.label}: " * (len(runs) > 1)
        + (f"medians of {len(run.ours_ttft_s)} alternated runs after a warm-up of each" if len(run.ours_ttft_s) > 1
           else "one run each")
        for run in runs
    )
    theirs = runs[0].theirs
    st.caption(
        f"{engine} on {theirs.device}, {theirs.dtype}, block size {BLOCK_SIZE}; ours run again at block size "
        f"{BLOCK_SIZE} for the diff. Times: {timing}; vLLM's step time is the wall time "
        "of its `LLMEngine.step` (schedule, forward, sample, outputs)."
    )
    if not all(run.comparison.schedule_equal for run in runs):
        st.markdown(POLICY_NOTE)


def block_maps(page: str, run: side_by_side.PeerRun) -> None:
    """Each request's prompt blocks on both engines, side by side (one workload)."""
    if not any(step.blocks_allocated for step in run.theirs.steps):
        return
    request_ids = list(run.ours.requests)
    columns = st.columns(2)
    for column, (who, trace) in zip(columns, (("ours", run.ours), ("vLLM", run.theirs))):
        blocks = [request_blocks(trace, request_id) for request_id in request_ids]
        title = f"Blocks, {who}{' (' + run.label + ')' if run.label else ''}"
        column.plotly_chart(block_grid_figure(blocks, BLOCK_SIZE, title), key=f"{page}_vllm_blocks_{who}")
    st.caption(BLOCK_MAP_NOTE)
