"""The vLLM worker: real vLLM, loaded once, running our workloads on request.

This file runs under ``.venv-vllm``'s interpreter (``make vllm``), never inside the app: vLLM
pins other versions of transformers than ours. It imports only the standard library and vLLM.
``prefillviz.peers.vllm_client`` starts it, writes one JSON request per line to its stdin and reads
one JSON reply per line from the file descriptor it passes (vLLM logs to stdout and stderr,
so they go to a log file).

A workload is requests (token ids, new tokens, the engine step at which each arrives) and a
token budget. The worker adds each request before the step it arrives at, calls vLLM's own
``LLMEngine.step`` until every request is finished, and replies with what vLLM did:

- every step: the requests it scheduled and how many tokens each ran (read from vLLM's own
  ``SchedulerOutput`` by a ``Scheduler`` subclass), and its wall time;
- every request: its output token ids, ``num_cached_tokens`` (vLLM's prefix-cache hit) and
  the time of its arrival and of each token.

vLLM reads the token budget from ``Scheduler.max_num_scheduled_tokens`` at every step (set
from ``max_num_batched_tokens`` when it starts), so a workload's budget is set there instead
of restarting vLLM (about 24 s) for each budget; the engine is built with the largest budget.
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
    """vLLM's scheduler, unchanged, keeping every ``SchedulerOutput`` it returns."""

    outputs: list = []  # the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)

    def schedule(self, *args, **kwargs):
        output = super().schedule(*args, **kwargs)
        RecordingScheduler.outputs.append(output)
        return output


def scheduled_chunks(output, request_ids) -> list[list]:
    """[request id, first position, tokens] per request in one step, from vLLM's SchedulerOutput.

    The engine core names a request by its id plus a suffix of its own ("a-86ae0ea7"); the
    reply uses the workload's ids.
    """
    start = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
    cached = output.scheduled_cached_reqs
    start.update(zip(cached.req_ids, cached.num_computed_tokens))

    def ours(internal_id: str) -> str:
        return internal_id if internal_id in request_ids else internal_id.rsplit("-", 1)[0]

    return [[ours(request_id), start[request_id], num_tokens] for request_id, num_tokens in output.num_scheduled_tokens.items()]


def the_scheduler(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def run_workload(llm, workload: dict) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine, scheduler = llm.llm_engine, the_scheduler(llm)
    scheduler.max_num_scheduled_tokens = int(workload["token_budget"])
    if workload.get("reset_prefix_cache", True):
        llm.reset_prefix_cache()
    pending = sorted(workload["requests"], key=lambda r: r["arrival_step"])
    requests = {r["id"]: {"output_token_ids": [], "token_times_s": [], "num_cached_tokens": 0} for r in pending}
    steps, step_index = [], 0
    RecordingScheduler.outputs.clear()
    start = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and pending[0]["arrival_step"] <= step_index:
            spec = pending.pop(0)
            params = SamplingParams(temperature=0.0, max_tokens=spec["max_new_tokens"], ignore_eos=True, seed=0)
            requests[spec["id"]]["arrival_s"] = time.perf_counter() - start
            engine.add_request(spec["id"], TokensPrompt(prompt_token_ids=spec["token_ids"]), params)
        if not engine.has_unfinished_requests():  # nothing runs until the next arrival
            step_index += 1
            continue
        scheduled_before = len(RecordingScheduler.outputs)
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
        steps.append({"chunks": chunks, "start_s": step_start - start, "wall_s": step_end - step_start})
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
        import vllm
        from vllm import LLM

        engine_args = {  # vLLM's EngineArgs
            "model": args.model, "dtype": args.dtype, "seed": 0,
            "enforce_eager": True,  # no graph capture: the same kernels every step
            "enable_prefix_caching": True, "enable_chunked_prefill": True,
            "block_size": args.block_size, "max_num_batched_tokens": args.max_token_budget, "max_model_len": args.max_model_len,
            "num_gpu_blocks_override": args.num_blocks,
            "scheduler_cls": RecordingScheduler,
        }
        llm = LLM(**engine_args)
    except Exception as error:  # the client shows this line, and the log has the rest
        traceback.print_exc()
        reply({"ready": False, "error": f"{type(error).__name__}: {error}"})
        return
    reply({"ready": True, "vllm": vllm.__version__, "torch": torch.__version__, "device": str(llm.llm_engine.vllm_config.device_config.device)})
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
