"""The replay's data: each scene's traces as plain JSON-ready dicts, frames included.

A scene has one or more lanes; a lane is one run (one trace) with its own clock. What the player
draws comes from these fields only:

    lane
      requests   id, prompt and output token ids, tokens found in the prefix cache
      steps      per step: start, chunks [request, first position, tokens, prefill?], blocks hit
                 and allocated per request, blocks evicted, free blocks after it, and (inspection
                 pass) the KV write log: per request its positions and cache slots
      frames     columns kind / step / layer / request / token / time_s (``frames.trace_frames``)

Request ids become indices into ``requests`` (in the order the steps first ran them); token ids
are decoded once, in the replay's ``token_text``.
"""

from __future__ import annotations

from typing import Any

from prefillviz.engine.trace import StepRecord, Trace
from prefillviz.experiments.inspect_run import request_token_indices
from prefillviz.figures.replay.frames import FRAME_KINDS, trace_frames
from prefillviz.instrument.passes import pass_label

TIME_DECIMALS = 7  # 0.1 microsecond: finer than anything drawn, coarser than the clock's noise


def request_order(trace: Trace) -> list[str]:
    """The trace's request ids in the order its steps first ran them (then any that never ran)."""
    seen = dict.fromkeys(chunk.request_id for step in trace.steps for chunk in step.chunks)
    return list(seen) + [request_id for request_id in trace.requests if request_id not in seen]


def token_slots(trace: Trace, request_id: str, position: int) -> list[tuple[int, int]]:
    """Where a prompt token's K/V went, from the KV write log: (layer, cache slot) for every layer that wrote it.

    Returns:
        The pairs in the order the layers wrote; empty where the trace has no KV write log for it.
    """
    for step in trace.steps:
        writes = step.kv_writes
        if writes is None:
            continue
        for index in request_token_indices(step, request_id):
            if int(writes.positions[index]) == position:
                return [(layer, int(writes.slots[index])) for layer in writes.layers_written]
    return []


def _kv_log(step: StepRecord, index_of: dict[str, int]) -> list[list] | None:
    """The step's KV write log per request: [request index, positions, slots]."""
    writes = step.kv_writes
    if writes is None:
        return None
    log = []
    for chunk in step.chunks:
        rows = request_token_indices(step, chunk.request_id)
        log.append([index_of[chunk.request_id], writes.positions[rows].tolist(), writes.slots[rows].tolist()])
    return log


def _step_payload(step: StepRecord, index_of: dict[str, int]) -> dict[str, Any]:
    return {
        "start_s": round(step.start_time_s, TIME_DECIMALS),
        "wall_s": round(step.wall_time_s, TIME_DECIMALS),
        "chunks": [[index_of[c.request_id], c.start_position, c.num_tokens, c.is_prefill] for c in step.chunks],
        "hit": [[index_of[r], list(blocks)] for r, blocks in step.blocks_hit.items() if blocks],
        "alloc": [[index_of[r], list(blocks)] for r, blocks in step.blocks_allocated.items() if blocks],
        "evicted": list(step.blocks_evicted),
        "free": step.num_free_blocks,
        "layers": list(step.kv_writes.layers_written) if step.kv_writes is not None else [],
        "kv": _kv_log(step, index_of),
    }


def frame_columns(trace: Trace, index_of: dict[str, int]) -> dict[str, list]:
    """``trace_frames`` as columns (kind as an index into ``FRAME_KINDS``, request as an index, -1 for none)."""
    frames = trace_frames(trace)
    return {
        "kind": [FRAME_KINDS.index(frame.kind) for frame in frames],
        "step": [frame.step for frame in frames],
        "layer": [frame.layer for frame in frames],
        "request": [index_of.get(frame.request_id, -1) for frame in frames],
        "token": [frame.token_id for frame in frames],
        "time_s": [round(frame.time_s, TIME_DECIMALS) for frame in frames],
    }


def lane_payload(trace: Trace, name: str, note: str = "") -> dict[str, Any]:
    """One run as the player reads it.

    Args:
        trace: the run.
        name: the lane's title ("prefill in one step").
        note: one line under the title (the budget, the workload).
    """
    order = request_order(trace)
    index_of = {request_id: i for i, request_id in enumerate(order)}
    layers = {len(step.kv_writes.layers_written) for step in trace.steps if step.kv_writes is not None}
    return {
        "name": name,
        "note": note,
        "capture_level": trace.capture_level,
        "pass": pass_label(trace.capture_level),
        "block_size": trace.engine_config["block_size"],
        "token_budget": trace.engine_config["token_budget"],
        "num_blocks": trace.num_blocks,
        "num_layers": max(layers, default=0),
        "requests": [
            {"id": rid, "prompt": trace.requests[rid].prompt_token_ids, "output": trace.requests[rid].output_token_ids,
             "num_cached_tokens": trace.requests[rid].num_cached_tokens}
            for rid in order
        ],
        "steps": [_step_payload(step, index_of) for step in trace.steps],
        "frames": frame_columns(trace, index_of),
    }


def scene_payload(scene_id: str, title: str, kind: str, caption: str, lanes: list[dict[str, Any]]) -> dict[str, Any]:
    """A scene: its lanes and their total frame count (``kind``: "kv_grid", "schedule" or "prefix")."""
    return {
        "id": scene_id, "title": title, "kind": kind, "caption": caption, "lanes": lanes,
        "num_frames": sum(len(lane["frames"]["kind"]) for lane in lanes),
    }
