"""The vLLM worker: real vLLM, loaded once, running our workloads on request.

This file runs under ``.venv-vllm``'s interpreter (``make vllm``), never inside the app: vLLM
pins other versions of transformers than ours. It imports only the standard library and vLLM.
``prefillviz.peers.vllm_client`` starts it, writes one JSON request per line to its stdin and reads
one JSON reply per line from the file descriptor it passes (vLLM logs to stdout and stderr,
so they go to a log file).

A workload is requests (token ids, new tokens, sampling, the engine step or the time at which
each arrives), a token budget, and chunking and prefix caching on or off. The worker adds each
request before the step it arrives at, calls vLLM's own ``LLMEngine.step`` until every request
is finished, and replies with what vLLM did:

- every step: the requests it scheduled and how many tokens each ran (read from vLLM's own
  ``SchedulerOutput`` by a ``Scheduler`` subclass), its block map (each request's block table,
  the cached blocks it evicted, the free blocks) and its wall time;
- every request: its output token ids, ``num_cached_tokens`` (vLLM's prefix-cache hit) and
  the time of its arrival and of each token.

vLLM reads the token budget from ``Scheduler.max_num_scheduled_tokens`` at every step (set
from ``max_num_batched_tokens`` when it starts), so a workload's budget is set there instead
of restarting vLLM (about 24 s) for each budget; the engine is built with the largest budget.
Chunking is set the same way (``scheduler_config.enable_chunked_prefill``, read at every
schedule), and prefix caching off is vLLM's own per-request ``skip_reading_prefix_cache``
(the blocks are still hashed and kept, but no request reads them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from vllm.v1.core.sched.scheduler import Scheduler


class RecordingScheduler(Scheduler):
    """vLLM's scheduler, unchanged, keeping every ``SchedulerOutput`` it returns and, when
    ``record_blocks`` is on, its block map after each schedule: every scheduled request's block
    table (``kv_cache_manager.get_block_ids``) and the cached blocks whose hash went (evictions)."""

    outputs: list = []  # the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    blocks: list = []
    record_blocks = True

    def cached_blocks(self) -> dict:
        return {b.block_id: b.block_hash for b in self.kv_cache_manager.block_pool.blocks if b.block_hash is not None}

    def schedule(self, *args, **kwargs):
        before = self.cached_blocks() if RecordingScheduler.record_blocks else {}
        output = super().schedule(*args, **kwargs)
        RecordingScheduler.outputs.append(output)
        if RecordingScheduler.record_blocks:
            after = self.cached_blocks()
            RecordingScheduler.blocks.append({
                "tables": {
                    rid: list(self.kv_cache_manager.get_block_ids(rid)[0]) for rid in output.num_scheduled_tokens
                },
                "evicted": sorted(
                    block_id for block_id, block_hash in before.items() if after.get(block_id) != block_hash
                ),
            })
        return output


def scheduled_chunks(output, request_ids) -> list[list]:
    """[request id, first position, tokens] per request in one step, from vLLM's SchedulerOutput.

    The engine core names a request by its id plus a suffix of its own ("a-86ae0ea7"); the
    reply uses the workload's ids.
    """
    start = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
    cached = output.scheduled_cached_reqs
    start.update(zip(cached.req_ids, cached.num_computed_tokens))

    return [
        [our_id(request_id, request_ids), start[request_id], num_tokens]
        for request_id, num_tokens in output.num_scheduled_tokens.items()
    ]


def our_id(internal_id: str, request_ids) -> str:
    return internal_id if internal_id in request_ids else internal_id.rsplit("-", 1)[0]


def the_scheduler(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def block_map(records: list[dict], ours) -> dict:
    """One step's block map from the schedules it ran (one, unless vLLM scheduled twice), in the workload's ids."""
    tables, evicted = {}, []
    for record in records:
        tables.update({ours(rid): ids for rid, ids in record["tables"].items()})
        evicted += record["evicted"]
    return {"tables": tables, "evicted": evicted}


def sampling_params(spec: dict, prefix_caching: bool):
    """vLLM's ``SamplingParams`` for one request: greedy unless it says otherwise, EOS ignored;
    ``skip_reading_prefix_cache`` is vLLM's own per-request switch for prefix caching off."""
    from vllm import SamplingParams

    return SamplingParams(
        temperature=spec.get("temperature", 0.0), top_p=spec.get("top_p", 1.0), top_k=spec.get("top_k", 0),
        seed=spec.get("seed", 0), max_tokens=spec["max_new_tokens"], ignore_eos=True,
        skip_reading_prefix_cache=None if prefix_caching else True,
    )


def arrived(spec: dict, step_index: int, elapsed_s: float) -> bool:
    """A request arrives at its step, or (``arrival_s``) at the first step boundary after that time."""
    return elapsed_s >= spec["arrival_s"] if spec.get("arrival_s") is not None else spec["arrival_step"] <= step_index


def run_workload(llm, workload: dict) -> dict:
    from vllm.inputs import TokensPrompt

    engine, scheduler = llm.llm_engine, the_scheduler(llm)
    scheduler.max_num_scheduled_tokens = int(workload["token_budget"])
    scheduler.scheduler_config.enable_chunked_prefill = bool(workload.get("chunking", True))  # read at every schedule
    prefix_caching = bool(workload.get("prefix_caching", True))
    RecordingScheduler.record_blocks = bool(workload.get("record_blocks", True))
    if workload.get("reset_prefix_cache", True):
        llm.reset_prefix_cache()
    pending = sorted(workload["requests"], key=lambda r: (r.get("arrival_s") or 0.0, r["arrival_step"]))
    requests = {r["id"]: {"output_token_ids": [], "token_times_s": [], "num_cached_tokens": 0} for r in pending}
    steps, step_index = [], 0
    RecordingScheduler.outputs.clear()
    RecordingScheduler.blocks.clear()
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        for spec in [r for r in pending if arrived(r, step_index, time.perf_counter() - start)]:
            pending.remove(spec)
            requests[spec["id"]]["arrival_s"] = time.perf_counter() - start
            engine.add_request(
                spec["id"], TokensPrompt(prompt_token_ids=spec["token_ids"]), sampling_params(spec, prefix_caching)
            )
        if not engine.has_unfinished_requests():  # nothing runs until the next arrival
            timed = [r["arrival_s"] for r in pending if r.get("arrival_s") is not None]
            if timed and len(timed) == len(pending):
                time.sleep(max(0.0, min(timed) - (time.perf_counter() - start)))
            else:
                step_index += 1
            continue
        scheduled_before = len(RecordingScheduler.outputs)
        blocks_before = len(RecordingScheduler.blocks)
        step_start = time.perf_counter()
        outputs = engine.step()
        step_end = time.perf_counter()
        chunks = [c for o in RecordingScheduler.outputs[scheduled_before:] for c in scheduled_chunks(o, requests)]
        for output in outputs:
            record = requests[output.request_id]
            token_ids = list(output.outputs[0].token_ids)
            record["token_times_s"] += [step_end - start] * (len(token_ids) - len(record["output_token_ids"]))
            record["output_token_ids"] = token_ids
            record["num_cached_tokens"] = output.num_cached_tokens or 0
        step = {"chunks": chunks, "start_s": step_start - start, "wall_s": step_end - step_start}
        if RecordingScheduler.record_blocks:
            step["blocks"] = block_map(RecordingScheduler.blocks[blocks_before:], lambda rid: our_id(rid, requests))
            # after the step, as ours
            step["blocks"]["num_free_blocks"] = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        steps.append(step)
        step_index += 1
    return {"steps": steps, "requests": requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--max-token-budget", type=int, default=4096)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--num-blocks", type=int, default=None, help="cap vLLM's KV cache at this many blocks")
    parser.add_argument("--reply-fd", type=int, required=True, help="where the JSON replies go")
    args = parser.parse_args()
    replies = os.fdopen(args.reply_fd, "w", buffering=1)

    def reply(message: dict) -> None:
        replies.write(json.dumps(message) + "\n")

    try:
        import torch

        if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() in ("avx2", "default"):
            # the switch that makes torch and our ops run as on an AVX2-only CPU: vLLM picks its
            # kernels (_C_AVX2 or _C_AVX512) from these two, so it runs as on that CPU too
            torch.cpu._is_avx512_supported = lambda: False
            torch.cpu._is_avx512_bf16_supported = lambda: False
        import vllm
        from vllm import LLM

        engine_args = {  # vLLM's EngineArgs
            "model": args.model, "dtype": args.dtype, "seed": 0,
            "enforce_eager": True,  # no graph capture: the same kernels every step
            "enable_prefix_caching": True, "enable_chunked_prefill": True,
            "block_size": args.block_size, "max_num_batched_tokens": args.max_token_budget,
            "max_model_len": args.max_model_len,
            "num_gpu_blocks_override": args.num_blocks,
            "scheduler_cls": RecordingScheduler,
        }
        llm = LLM(**engine_args)
    except Exception as error:  # the client shows this line, and the log has the rest
        traceback.print_exc()
        reply({"ready": False, "error": f"{type(error).__name__}: {error}"})
        return
    num_blocks = the_scheduler(llm).kv_cache_manager.block_pool.num_gpu_blocks
    reply({
        "ready": True, "vllm": vllm.__version__, "torch": torch.__version__,
        "device": str(llm.llm_engine.vllm_config.device_config.device),
        "num_blocks": num_blocks,
    })
    for line in sys.stdin:
        try:
            request = json.loads(line)
            if request.get("op") == "quit":
                break
            reply({"ok": True, **run_workload(llm, request["workload"])})
        except Exception as error:
            traceback.print_exc()
            reply({"ok": False, "error": f"{type(error).__name__}: {error}"})


if __name__ == "__main__":
    main()
