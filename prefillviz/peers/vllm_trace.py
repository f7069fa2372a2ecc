"""What the vLLM worker replied to one workload, as our ``Trace`` (``vllm_client.py`` asks).

vLLM's steps carry no phase times, so each step's wall time is its forward time; its block
tables after each step become our ``blocks_hit`` / ``blocks_allocated``.
"""

from __future__ import annotations

from prefillviz.engine.scheduler import ScheduledChunk
from prefillviz.engine.trace import RequestRecord, StepRecord, Trace
from prefillviz.peers.workload import PeerRequest


def reply_trace(
    worker, reply: dict, requests: list[PeerRequest], token_budget: int, chunking: bool, prefix_caching: bool
) -> Trace:
    """The reply to one workload as our ``Trace``: its steps, block changes and requests; ``worker``
    is the ``VLLMWorker`` that ran it (its model folder, dtype, versions, block size, block count)."""
    prompts = {r.request_id: r.token_ids for r in requests}
    steps, known_blocks = [], {}  # request id -> the block ids it held after the last step it ran in
    for index, step in enumerate(reply["steps"]):
        chunks = [
            ScheduledChunk(
                request_id, start, num_tokens, start < len(prompts[request_id]),
                start + num_tokens >= len(prompts[request_id]),
            )
            for request_id, start, num_tokens in step["chunks"]
        ]
        hit, allocated = block_changes(step, chunks, known_blocks, worker.block_size)
        blocks = step.get("blocks") or {}
        steps.append(
            StepRecord(
                step_index=index, chunks=chunks, blocks_hit=hit, blocks_allocated=allocated,
                blocks_evicted=list(blocks.get("evicted", [])),
                preempted_request_ids=[], sampled_token_ids={}, num_free_blocks=blocks.get("num_free_blocks") or 0,
                start_time_s=step["start_s"], wall_time_s=step["wall_s"],
                schedule_time_s=0.0, prepare_time_s=0.0, forward_time_s=step["wall_s"], sample_time_s=0.0,
                update_time_s=0.0,
            )
        )
    records = {}
    for request_id, done in reply["requests"].items():
        times = done["token_times_s"]
        records[request_id] = RequestRecord(
            request_id=request_id,
            prompt_token_ids=list(prompts[request_id]),
            output_token_ids=done["output_token_ids"],
            status="finished_length",
            num_cached_tokens=done["num_cached_tokens"],
            num_preemptions=0,
            arrival_time_s=done.get("arrival_s", 0.0),
            tokenize_time_s=0.0,
            time_to_first_token_s=times[0] - done.get("arrival_s", 0.0) if times else None,
            inter_token_times_s=[b - a for a, b in zip(times, times[1:])],
        )
    config = {
        "engine": f"vLLM {worker.versions['vllm']}", "block_size": worker.block_size, "token_budget": token_budget,
        "enable_prefix_caching": prefix_caching, "enable_chunked_prefill": chunking,
    }
    return Trace(
        model_id=worker.model_folder, device=str(worker.versions["device"]), dtype=worker.dtype, engine_config=config,
        num_blocks=worker.num_blocks, kv_cache_bytes=0, kv_bytes_per_token=0, steps=steps, requests=records,
    )

def block_changes(
    step: dict, chunks: list[ScheduledChunk], known: dict[str, list[int]], block_size: int
) -> tuple[dict, dict]:
    """vLLM's block tables after a step as our ``blocks_hit`` / ``blocks_allocated``: a request's first
    chunk that starts past 0 found that many tokens' blocks in the cache; blocks new to its table were allocated."""
    tables = (step.get("blocks") or {}).get("tables", {})
    hit, allocated = {}, {}
    for chunk in chunks:
        table = tables.get(chunk.request_id)
        if table is None:
            continue
        before = known.get(chunk.request_id)
        if before is None:  # its first step: the blocks before its first computed token were hits
            num_hit = chunk.start_position // block_size
            before = table[:num_hit]
            if num_hit:
                hit[chunk.request_id] = before
        allocated[chunk.request_id] = table[len(before):]
        known[chunk.request_id] = table
    return hit, allocated
