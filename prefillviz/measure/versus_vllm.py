"""The bench against real vLLM: the same workloads on both engines, in one run, alternated.

Each key is our speed over vLLM's (above 1: ours is faster): the median over rounds of each
round's vLLM time over ours, the two measured back to back, after one warm-up round of each. A
ratio of neighbours cancels what drifts between rounds (a shared VM's speed moves by a fifth within
an hour here), which a ratio of the two sides' medians would not. vLLM runs in its worker
(``peers.vllm_client``), ours in this process, on the same token ids, dtype and block size (32,
vLLM's CPU attention's multiple). ``details.seconds`` keeps each side's median and spread, and
``details.ratios_by_round`` every round's ratio.

- ``engine_over_vllm_prefill_512`` / ``_2048``: time to first token of one fresh N-token prompt.
- ``textbook_over_vllm_prefill_512`` / ``_2048``: the same with the engine on its textbook backend
  (``engine/backend.py``'s plain torch), timed in the same rounds.
- ``engine_over_vllm_prefix_hit``: time to first token of a request whose 1,024-token prefix
  (2N at N=512) an earlier request of the same workload left in the cache, plus 32 new tokens.
- ``engine_over_vllm_decode``: mean time between tokens of one request decoding 64 tokens.
- ``vllm_outputs_equal``: requests of a mixed batch (8 prompts) whose greedy tokens are the same.
- ``vllm_outputs_within_tolerance``: those, and those that first part at a near tie of the plain HF
  forward (``parting``): in bf16 two correct engines may round a close race either way.

Without ``.venv-vllm`` every key is None and ``details.vllm.skipped`` says why.
"""

from __future__ import annotations

import contextlib
import statistics

import torch

from prefillviz.analysis import rounding
from prefillviz.engine.backend import TorchBackend, using_backend
from prefillviz.loading import bundled
from prefillviz.loading.prompts import bench_token_ids
from prefillviz.machine.devices import dtype_name
from prefillviz.machine.timers import median_and_spread
from prefillviz.measure.bench_keys import VLLM_KEYS
from prefillviz.peers import side_by_side
from prefillviz.peers.vllm_client import VLLMUnavailable, VLLMWorker, unavailable_for
from prefillviz.peers.workload import PeerRequest


def skipped(reason: str) -> dict:
    return {**dict.fromkeys(VLLM_KEYS), "details": {"skipped": reason}}


def vllm_side_by_side(loaded, num_tokens: int, runs: int, quick: bool, worker: VLLMWorker | None = None) -> dict:
    """The eight keys, and ``details`` with every median, spread, round's ratio and the versions.

    Args:
        runs: timed rounds, each running every workload on ours then on vLLM (quick: one).
        worker: a running vLLM worker to use (left running); None starts one and stops it after.
    """
    reason = unavailable_for(loaded.model_id, loaded.device.type)
    if reason:
        return skipped(reason)
    tokenizer = loaded.tokenizer
    sizes = (64, 256) if quick else (num_tokens, 4 * num_tokens)
    prefix_tokens, new_tokens = (64 if quick else 2 * num_tokens), 32
    dtype = dtype_name(loaded.dtype)
    workloads = {
        f"prefill_{n}": ([PeerRequest("prompt", bench_token_ids(tokenizer, n), 1)], "prompt", "ttft", max(n, 2048))
        for n in sizes
    }
    prefix = bench_token_ids(tokenizer, prefix_tokens)
    hit_request = PeerRequest("hit", prefix + bench_token_ids(tokenizer, new_tokens + 9)[9:], 1, arrival_step=2)
    workloads["prefix_hit"] = ([PeerRequest("first", prefix + [7], 1), hit_request], "hit", "ttft", 2048)
    workloads["decode"] = ([PeerRequest("decoder", bench_token_ids(tokenizer, 64), 8 if quick else 64)],
                           "decoder", "itl", 2048)
    sides = {name: ("ours", "textbook", "vllm") if name.startswith("prefill_") else ("ours", "vllm")
             for name in workloads}
    try:
        started = worker is None
        if started:
            worker = VLLMWorker(bundled.bundled_cache_dir(), dtype=dtype, max_token_budget=max(2048, 4 * num_tokens),
                                max_model_len=max(4096, 4 * num_tokens + 64))
        with worker if started else contextlib.nullcontext(worker):
            times = {name: {side: [] for side in sides[name]} for name in workloads}
            for round_index in range(1 + (1 if quick else runs)):  # round 0 warms every side up
                for name, (requests, request_id, what, budget) in workloads.items():
                    for side in sides[name]:
                        if side != "vllm":
                            with using_backend(TorchBackend() if side == "textbook" else None):
                                trace = side_by_side.run_ours(loaded.model, tokenizer, requests, budget,
                                                              model_id=loaded.model_id)
                        else:
                            trace = worker.run(requests, budget, record_blocks=False)  # no pool walk in its timed steps
                        record = trace.requests[request_id]
                        value = (record.time_to_first_token_s if what == "ttft"
                                 else statistics.mean(record.inter_token_times_s))
                        if round_index > 0:
                            times[name][side].append(value)
            lengths = (16, 32, 48, 64, 80, 96, 112, 128) if quick else (64, 128, 256, 384, 512, 640, 768, 1024)
            batch = [PeerRequest(f"r{i}", bench_token_ids(tokenizer, n + 7 * i)[7 * i :], 8 if quick else 32)
                     for i, n in enumerate(lengths)]
            ours_batch, theirs_batch = (side_by_side.run_ours(loaded.model, tokenizer, batch, 512),
                                        worker.run(batch, 512))
            comparison = side_by_side.compare(ours_batch, theirs_batch)
            versions = worker.versions
    except VLLMUnavailable as error:
        return skipped(str(error).splitlines()[0])
    by_round = {name: [theirs / ours for ours, theirs in zip(t["ours"], t["vllm"])] for name, t in times.items()}
    by_round |= {f"textbook_{name}": [v / o for o, v in zip(t["textbook"], t["vllm"])]
                 for name, t in times.items() if "textbook" in t}
    ratio = {name: statistics.median(ratios) for name, ratios in by_round.items()}
    parted = parting(loaded, batch, ours_batch, theirs_batch, comparison.outputs_differ)
    return {
        "engine_over_vllm_prefill_512": ratio[f"prefill_{sizes[0]}"],
        "engine_over_vllm_prefill_2048": ratio[f"prefill_{sizes[1]}"],
        "textbook_over_vllm_prefill_512": ratio[f"textbook_prefill_{sizes[0]}"],
        "textbook_over_vllm_prefill_2048": ratio[f"textbook_prefill_{sizes[1]}"],
        "engine_over_vllm_prefix_hit": ratio["prefix_hit"],
        "engine_over_vllm_decode": ratio["decode"],
        "vllm_outputs_equal": len(comparison.outputs_equal),
        "vllm_outputs_within_tolerance": len(comparison.outputs_equal) + sum(p["near_tie"] for p in parted),
        "details": {
            "versions": versions,
            "sizes": {"prefill": list(sizes), "prefix_tokens": prefix_tokens, "block_size": 32, "dtype": dtype},
            "seconds": {name: {side: median_and_spread(values) for side, values in t.items()}
                        for name, t in times.items()},
            "ratios_by_round": by_round,
            "mixed_batch": comparison.summary(),
            "outputs_compared": len(comparison.outputs_equal) + len(comparison.outputs_differ),
            "parting": parted,
        },
    }


@torch.inference_mode()
def parting(loaded, requests: list[PeerRequest], ours, theirs, request_ids: list[str]) -> list[dict]:
    """Where each differing request's greedy tokens first part, and whether that is a near tie.

    The plain HF forward (the model in its own dtype) of the prompt and the tokens both engines
    agree on gives the logits there; the two engines' tokens are a near tie when HF's logits of
    them are within twice ``rounding``'s bound for two forward passes of this dtype (as the KV
    equality's ``top_tokens_agree``): a race that rounding, not a bug, decides.
    """
    prompts = {r.request_id: list(r.token_ids) for r in requests}
    parted = []
    for request_id in request_ids:
        a, b = ours.requests[request_id].output_token_ids, theirs.requests[request_id].output_token_ids
        position = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if position is None:  # one stopped earlier: not a race between two tokens
            parted.append({"request": request_id, "position": min(len(a), len(b)), "ours": None, "vllm": None,
                           "hf_logit_gap": None, "allowed": None, "near_tie": False})
            continue
        token_ids = prompts[request_id] + list(a[:position])
        logits = loaded.model(input_ids=torch.tensor([token_ids], device=loaded.device),
                              logits_to_keep=1).logits[0, -1].float()
        terms = rounding.longest_sum(loaded.model.config, len(token_ids))
        allowed = rounding.relative_bound(loaded.dtype, rounding.TWO_FORWARDS_STEPS, terms) * float(logits.abs().max())
        gap = abs(float(logits[a[position]] - logits[b[position]]))
        parted.append({"request": request_id, "position": position, "ours": a[position], "vllm": b[position],
                       "hf_logit_gap": gap, "allowed": allowed, "near_tie": gap <= 2 * allowed})
    return parted
