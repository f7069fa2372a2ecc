"""The replay of three recorded runs (``experiments.replay_runs``): its scenes, as one JSON-ready dict.

    scene        kind       lanes
    prefill      kv_grid    prefill in one step | the same prompt token by token (inspection pass)
    chunked      schedule   the chunked-prefill workload, chunking on (timing pass)
    prefix       prefix     two questions on one system prompt, cache on (timing pass)

The prefill scene also carries ``attention``: a few heads' attention maps of the one-step prefill,
from its inspection pass (``attention.attention_payload``).

Every caption is computed from the traces (their lengths, steps, budgets, hits and times).
"""

from __future__ import annotations

from typing import Any

from prefillviz.engine.trace import Trace
from prefillviz.experiments.chunked import LONG_REQUEST_ID
from prefillviz.experiments.replay_runs import ReplayRuns
from prefillviz.figures.replay.attention import attention_payload
from prefillviz.figures.replay.scenes import lane_payload, scene_payload


def run_time_ms(trace: Trace) -> float:
    """From the run's first step to the end of its last, milliseconds."""
    last = trace.steps[-1]
    return (last.start_time_s + last.wall_time_s) * 1000


def prefill_scene(parallel: Trace, token_by_token: Trace) -> dict[str, Any]:
    """The same prompt in one step and one token per step, on the KV grid (layers x cache slots), and the one
    step's attention maps."""
    num_tokens = next(iter(parallel.requests.values())).num_prompt_tokens
    lanes = [
        lane_payload(parallel, "Prefill: the whole prompt in one step",
                     f"token budget {parallel.engine_config['token_budget']:,} · {parallel.num_steps} step · "
                     f"{run_time_ms(parallel):,.1f} ms"),
        lane_payload(token_by_token, "Token by token: one position per step",
                     f"token budget {token_by_token.engine_config['token_budget']} · {token_by_token.num_steps:,} "
                     f"steps · {run_time_ms(token_by_token):,.1f} ms"),
    ]
    caption = (
        f"The same {num_tokens:,}-token prompt, run twice. With a budget of {num_tokens:,} the prompt is one step: "
        f"layer 0 writes the keys and values of all {num_tokens:,} positions, then layer 1, and so on. With a budget "
        f"of 1 every step writes one position in all {lanes[0]['num_layers']} layers. Each cell is one layer's K/V "
        "slot in the paged cache (columns: slots, grouped in blocks)."
    )
    attention = attention_payload(parallel)
    if attention is not None:
        caption += (
            f" Under the grid, the prefill step's attention map: {num_tokens:,} queries x {num_tokens:,} keys of "
            f"one head, in layers {', '.join(map(str, attention['layers']))}; it appears when its layer's span ends."
        )
    scene = scene_payload("prefill", "Prefill vs token by token", "kv_grid", caption, lanes)
    scene["attention"] = attention
    return scene


def chunked_scene(trace: Trace) -> dict[str, Any]:
    """Short requests decoding while a long prompt is chunked into each step's token budget."""
    long = trace.requests[LONG_REQUEST_ID]
    arrival = next(step.step_index for step in trace.steps
                   if any(chunk.request_id == LONG_REQUEST_ID for chunk in step.chunks))
    num_chunks = sum(chunk.request_id == LONG_REQUEST_ID and chunk.is_prefill
                     for step in trace.steps for chunk in step.chunks)
    budget = trace.engine_config["token_budget"]
    lane = lane_payload(trace, "Chunking on", f"token budget {budget} · {trace.num_steps} steps · "
                        f"{run_time_ms(trace):,.1f} ms")
    caption = (
        f"{len(trace.requests) - 1} short requests are decoding when a {long.num_prompt_tokens:,}-token prompt "
        f"arrives (in step {arrival + 1}). Each step has a budget of {budget} tokens: the decodes go first, one token "
        f"each, and the prompt gets the rest, so it runs in {num_chunks} chunk{'s' if num_chunks != 1 else ''} while "
        "nobody stops decoding. Blocks are allocated as the chunks need them."
    )
    return scene_payload("chunked", "Chunked prefill", "schedule", caption, [lane])


def prefix_scene(trace: Trace) -> dict[str, Any]:
    """Requests that share a prefix, one after another on one engine: the later ones hit its blocks."""
    records = list(trace.requests.values())
    block_size = trace.engine_config["block_size"]
    lane = lane_payload(trace, "Prefix cache on", f"block size {block_size} · {trace.num_steps} steps · "
                        f"{run_time_ms(trace):,.1f} ms")
    hits = "; ".join(
        f"{r.request_id} finds {r.num_cached_tokens // block_size} blocks ({r.num_cached_tokens} tokens) and computes "
        f"{r.num_prompt_tokens - r.num_cached_tokens}" for r in records[1:]
    )
    caption = (
        f"{records[0].request_id} computes all {records[0].num_prompt_tokens} prompt tokens and its full blocks are "
        f"hashed; {hits}. Only full blocks are shared, so the prompt's tail is computed again."
    )
    return scene_payload("prefix", "Prefix-cache hit", "prefix", caption, [lane])


def replay_payload(runs: ReplayRuns) -> dict[str, Any]:
    """The three scenes of ``runs`` and what names them, for the player (``page.replay_html``)."""
    scenes = [
        prefill_scene(runs.parallel, runs.token_by_token),
        chunked_scene(runs.chunked),
        prefix_scene(runs.prefix),
    ]
    return {
        "model_id": runs.model_id, "device": runs.device, "dtype": runs.dtype, "num_tokens": runs.num_tokens,
        "scenes": scenes, "num_frames": sum(scene["num_frames"] for scene in scenes),
        "token_text": {str(token): text for token, text in runs.token_text.items()},
    }
