"""The bench's parts beyond the prefill's own timings (``bench.run_bench`` runs them in order):
a prefix hit against a miss, the engine's packed linears against stock, chunked prefill on
against off. Each interleaves what it compares and returns its figure with every median and spread."""

from __future__ import annotations

import statistics
from dataclasses import replace

import torch

from prefillviz.backends.packed_weights import packed_linears, packing_status
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.experiments.chunked import WorkloadSettings, build_workload, latency_summary, run_workload
from prefillviz.loading.prompts import bench_token_ids
from prefillviz.machine.timers import median_and_spread, run_timed


def prefix_hit_speedup(loaded, prefix_tokens: int, runs: int, new_tokens: int = 32) -> dict:
    """TTFT of a prompt whose first ``prefix_tokens`` are cached, miss over hit (interleaved runs)."""
    token_ids = bench_token_ids(loaded.tokenizer, prefix_tokens + new_tokens)
    prefix, prompt = token_ids[:prefix_tokens], token_ids

    def ttft(enable_prefix_caching: bool) -> float:
        engine = LLMEngine(loaded.model, loaded.tokenizer,
                           EngineConfig(token_budget=4096, enable_prefix_caching=enable_prefix_caching))
        engine.add_request(prefix)  # an earlier request with the same prefix fills the cache
        engine.run()
        request = engine.add_request(prompt)
        return engine.run().requests[request.request_id].time_to_first_token_s

    ttft(True), ttft(False)  # warm-up
    hits, misses = [], []
    for _ in range(runs):  # a hit is ~0.1 s: fixed per-step costs, so its spread needs several runs
        hits.append(ttft(True))
        misses.append(ttft(False))
    return {
        "prefix_tokens": prefix_tokens,
        "new_tokens": new_tokens,
        "ttft_hit_s": median_and_spread(hits),
        "ttft_miss_s": median_and_spread(misses),
        "speedup": statistics.median(misses) / statistics.median(hits),
    }


def packed_over_stock(loaded, num_tokens: int, runs: int) -> dict:
    """One forward of 1, 32 and N tokens with the linears packed (the engine's CPU path) over stock, interleaved
    pairs."""
    model = loaded.model
    applies, why = packing_status(model)
    if not applies:
        return {"applies": False, "why": why}
    token_ids = bench_token_ids(loaded.tokenizer, num_tokens)
    rows = {}
    for length in sorted({1, min(32, num_tokens), num_tokens}):
        input_ids = torch.tensor([token_ids[:length]], device=loaded.device)

        @torch.inference_mode()
        def stock() -> None:
            model(input_ids=input_ids, logits_to_keep=1)

        @torch.inference_mode()
        def packed() -> None:
            with packed_linears(model):
                model(input_ids=input_ids, logits_to_keep=1)

        stock(), packed()  # warm-up (and the packing itself)
        stock_s, packed_s = [], []
        for _ in range(runs):
            stock_s.append(run_timed(stock, loaded.device)[0])
            packed_s.append(run_timed(packed, loaded.device)[0])
        rows[f"{length}_tokens"] = {
            "packed_over_stock": statistics.median(p / s for p, s in zip(packed_s, stock_s)),
            "stock_s": median_and_spread(stock_s),
            "packed_s": median_and_spread(packed_s),
        }
    return {"applies": True, **rows}


def chunked_ratios(loaded, long_tokens: int, rounds: int, workload_settings: WorkloadSettings) -> dict:
    """Short requests decoding when a ``long_tokens`` prompt arrives, chunking on over off, ``rounds`` times."""
    settings = replace(workload_settings, long_prompt_tokens=long_tokens)
    workload = build_workload(loaded.tokenizer, **settings.as_dict())
    run_workload(loaded.model, workload, True)  # warm-up
    max_itl, total = [], []
    for _ in range(rounds):
        off = latency_summary(run_workload(loaded.model, workload, False))
        on = latency_summary(run_workload(loaded.model, workload, True))
        max_itl.append(on.itl_max_ms / off.itl_max_ms)
        total.append(on.total_ms / off.total_ms)
    return {
        "workload": (f"{settings.num_short_requests} requests decoding ({settings.short_prompt_tokens}-token prompts, "
                     f"{settings.short_max_new_tokens} new tokens) "
                     f"when a {long_tokens}-token prompt arrives; budget {settings.token_budget} vs no chunking"),
        "max_itl_ratio": statistics.median(max_itl),
        "total_time_ratio": statistics.median(total),
        "max_itl_ratios": median_and_spread(max_itl),
        "total_time_ratios": median_and_spread(total),
    }
