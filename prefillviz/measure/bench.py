"""``python -m prefillviz bench``: the engine's cost against the plain HF forward.

Timing discipline (gpt-fast / nanoGPT ``bench.py``): warm up first, synchronize the device
before reading the clock, interleave the runs being compared so drift hits both, report
medians with their spread. Every figure is measured in this run; nothing is remembered.
The parts in a fresh process (cold start, the inspection's peak RSS) are in
``bench_fresh_process``; the peer, transformers' own continuous batching, in ``bench_peer``.

``--quick`` (``QUICK_SIZES``) runs every part on the smallest work that still fills
every key, for the test of the JSON's keys and shape; its figures say nothing and the JSON
says ``"quick": true``. The figures are ``make bench``'s (``FULL_SIZES``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from prefillviz.analysis.flops import model_costs
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.devices import dtype_name
from prefillviz.engine.dispatch_tables import summary as dispatch_summary
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.machine_load import MachineLoad
from prefillviz.engine.packed_weights import packed_linears, packing_status
from prefillviz.engine.timers import median_and_spread, run_timed
from prefillviz.experiments.chunked import build_workload, latency_summary, run_workload
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.instrument.capture import run_captured
from prefillviz.loading.models import load_model
from prefillviz.loading.prompts import bench_token_ids
from prefillviz.measure.fresh_process import cold_start_s, inspect_peak_rss_mb
from prefillviz.measure.hf_batching import engine_over_hf_cb
from prefillviz.measure.peaks import measure_matmul_gflops
from prefillviz.measure.peaks_history import machine_peaks
from prefillviz.measure.versus_vllm import KEYS as VLLM_KEYS
from prefillviz.measure.versus_vllm import skipped as vllm_skipped
from prefillviz.measure.versus_vllm import vllm_side_by_side


@dataclass(frozen=True)
class BenchSizes:
    """How much work each part of the bench does, beyond N and the timed runs."""

    warmup_runs: int = 2
    min_runs: int = 3  # floor of the rounds for the N-step token-by-token runs and the chunked workload
    cold_start_runs: int = 5  # fresh processes, one after another (the model's files are in the page cache by then)
    inspect_rss_tokens: int = 4096
    peer_prompt_lengths: tuple[int, ...] = (64, 128, 256, 384, 512, 640, 768, 1024)  # at N=512, scaled by N/512
    peer_new_tokens: int = 32
    peer_rounds: int = 2
    peer_cache_blocks: int | None = None  # transformers' paged cache; None: it sizes one from the free memory (seconds)
    chunked_short_requests: int = 4
    chunked_short_prompt_tokens: int = 32
    chunked_short_new_tokens: int = 24


FULL_SIZES = BenchSizes()  # make bench
QUICK_SIZES = BenchSizes(  # bench --quick: the test of the JSON's keys and shape
    warmup_runs=1, min_runs=1, cold_start_runs=1, inspect_rss_tokens=64, peer_prompt_lengths=(64, 256),
    peer_new_tokens=4, peer_rounds=1, peer_cache_blocks=8, chunked_short_requests=2, chunked_short_prompt_tokens=8, chunked_short_new_tokens=4,
)


def run_bench(
    model_id: str, device: str, dtype: str, num_tokens: int = 512, runs: int = 7, quick: bool = False, with_vllm: bool = True, loaded=None
) -> dict:
    """Measure and return the benchmark figures (see the README for each key).

    Args:
        quick: every part on ``QUICK_SIZES``: the same keys, no figures to read.
        with_vllm: False leaves out the side-by-side with vLLM (its keys are None, with the reason).
        loaded: the model already loaded (the command line loads it to check the sizes first); None loads it.
    """
    sizes = QUICK_SIZES if quick else FULL_SIZES
    loaded = loaded or load_model(model_id, device=device, dtype=dtype)
    model, device_ = loaded.model, loaded.device
    token_ids = bench_token_ids(loaded.tokenizer, num_tokens)
    input_ids = torch.tensor([token_ids], device=device_)

    @torch.inference_mode()
    def hf_forward() -> None:
        model(input_ids=input_ids, logits_to_keep=1).logits.argmax(-1).item()

    def engine_prefill(token_budget: int, capture_level: str = "none") -> Callable[[], None]:
        engine = one_request_engine(model, loaded.tokenizer, token_budget, model_id=loaded.model_id)  # cache off: every run computes

        def prefill() -> None:
            engine.add_request(token_ids)
            run_captured(engine, capture_level=capture_level)

        return prefill

    @torch.inference_mode()
    def hf_token_by_token() -> None:  # HF's own decode loop: one token at a time into a DynamicCache
        cache = DynamicCache(config=model.config)
        for position in range(num_tokens):
            model(input_ids=input_ids[:, position : position + 1], cache=cache, use_cache=True, logits_to_keep=1)

    budget = max(num_tokens, 2048)
    parallel = engine_prefill(budget)
    timed = engine_prefill(budget, "timing")
    inspected = engine_prefill(budget, "inspect")
    sequential = engine_prefill(token_budget=1)

    for _ in range(sizes.warmup_runs):
        for fn in (hf_forward, parallel, timed, inspected):
            fn()
    sequential()
    hf_token_by_token()

    machine = MachineLoad()  # how busy the machine was while the figures were measured
    with machine:
        hf_times, parallel_times, timing_times, inspect_times, sequential_times, hf_sequential_times = [], [], [], [], [], []
        gemm_gflops = []  # the peak the prefill is held against, measured between its runs
        for i in range(runs):  # interleaved, so drift hits every variant alike
            gemm_gflops.append(measure_matmul_gflops(device_, loaded.dtype, runs=1))
            hf_times.append(run_timed(hf_forward, device_)[0])
            parallel_times.append(run_timed(parallel, device_)[0])
            timing_times.append(run_timed(timed, device_)[0])
            inspect_times.append(run_timed(inspected, device_)[0])
            if i < max(sizes.min_runs, runs // 2):  # N steps each: fewer runs
                sequential_times.append(run_timed(sequential, device_)[0])
                hf_sequential_times.append(run_timed(hf_token_by_token, device_)[0])
        prefix = _prefix_hit_speedup(loaded, 2 * num_tokens, runs)
        packing = _packed_over_stock(loaded, num_tokens, runs)
        chunked = _chunked_ratios(loaded, 2 * num_tokens, runs, sizes)
        inspect_rss_mb = inspect_peak_rss_mb(model_id, device, dtype, sizes.inspect_rss_tokens)
        cold_starts, cold_exits = zip(*(cold_start_s(model_id, device, dtype) for _ in range(sizes.cold_start_runs)))
        peer = engine_over_hf_cb(
            loaded, num_tokens, sizes.peer_prompt_lengths, sizes.peer_new_tokens, sizes.peer_rounds, sizes.peer_cache_blocks
        )  # transformers' continuous batching sizes a large cache
        versus_vllm = (  # last: it starts vLLM
            vllm_side_by_side(loaded, num_tokens, max(sizes.min_runs, runs // 2), quick) if with_vllm else vllm_skipped("--no-vllm: the comparison with vLLM was left out")
        )

    ratios = [p / h for p, h in zip(parallel_times, hf_times)]
    parallel_median = statistics.median(parallel_times)
    prefill_flops = model_costs(loaded.info, num_tokens, num_tokens).total_flops
    peaks = machine_peaks(device_, loaded.dtype)
    return {
        "quick": quick,  # True: QUICK_SIZES, a check of the keys, not figures
        "model": loaded.model_id,
        "device": str(device_),
        "dtype": dtype_name(loaded.dtype),
        "torch_threads": torch.get_num_threads(),
        "num_tokens": num_tokens,
        "overhead_vs_hf": statistics.median(ratios),
        "sequential_over_parallel": statistics.median(sequential_times) / parallel_median,
        "prefill_tok_s": num_tokens / parallel_median,
        "timing_overhead": statistics.median(t / p for t, p in zip(timing_times, parallel_times)),
        "inspect_overhead": statistics.median(t / p for t, p in zip(inspect_times, parallel_times)),
        "inspect_4096_peak_rss_mb": inspect_rss_mb,
        "gemm_peak_gflops": statistics.median(gemm_gflops),
        "prefill_achieved_gflops": prefill_flops / parallel_median / 1e9,
        "prefill_fraction_of_peak": prefill_flops / parallel_median / 1e9 / statistics.median(gemm_gflops),
        "sequential_over_hf_decode": statistics.median(sequential_times) / statistics.median(hf_sequential_times),
        "prefix_hit_speedup": prefix["speedup"],
        "cold_start_s": statistics.median(cold_starts),
        "chunked_max_itl_ratio": chunked["max_itl_ratio"],
        "chunked_total_time_ratio": chunked["total_time_ratio"],
        "engine_over_hf_cb": peer["speedup"],
        **{key: versus_vllm[key] for key in VLLM_KEYS},
        "dispatch": dispatch_summary(model),  # what the engine ran: the measured choice per step shape, and its timings
        "details": {
            "vllm": versus_vllm["details"],
            "hf_forward_s": median_and_spread(hf_times),
            "engine_parallel_prefill_s": median_and_spread(parallel_times),
            "engine_token_by_token_s": median_and_spread(sequential_times),
            "overhead_vs_hf_ratios": median_and_spread(ratios),
            "hf_token_by_token_s": median_and_spread(hf_sequential_times),
            "prefix_hit": prefix,
            "packed_weights": packing,
            "chunked": chunked,
            "hf_continuous_batching": peer,
            "cold_start": "fresh process: import, load the model from the prefillviz cache, first token of a short prompt (until it prints it)",
            "cold_start_s": median_and_spread(list(cold_starts)),
            "cold_start_to_exit_s": median_and_spread(list(cold_exits)),
            "engine_timing_capture_s": median_and_spread(timing_times),
            "engine_inspect_capture_s": median_and_spread(inspect_times),
            "prefill_flops": prefill_flops,
            "gemm_gflops": median_and_spread(gemm_gflops),
            "machine_peaks": {  # the cached peaks the app's roofline uses, for comparison
                "matmul_gflops": peaks.matmul_gflops, "memory_gb_s": peaks.memory_gb_s, "measured_at": peaks.measured_at,
                "machine": peaks.machine,
            },
            "inspect_rss": f"fresh process: load the model, inspect-capture a {sizes.inspect_rss_tokens}-token prefill, peak RSS",
            "warmup_runs": sizes.warmup_runs,
            "machine_load": machine.reading.as_dict(),  # other processes' share of the cores during the timed parts
        },
    }


def _prefix_hit_speedup(loaded, prefix_tokens: int, runs: int, new_tokens: int = 32) -> dict:
    """TTFT of a prompt whose first ``prefix_tokens`` are cached, miss over hit (interleaved runs)."""
    token_ids = bench_token_ids(loaded.tokenizer, prefix_tokens + new_tokens)
    prefix, prompt = token_ids[:prefix_tokens], token_ids

    def ttft(enable_prefix_caching: bool) -> float:
        engine = LLMEngine(loaded.model, loaded.tokenizer, EngineConfig(token_budget=4096, enable_prefix_caching=enable_prefix_caching))
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


def _packed_over_stock(loaded, num_tokens: int, runs: int) -> dict:
    """One forward of 1, 32 and N tokens with the linears packed (the engine's CPU path) over stock, interleaved pairs."""
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


def _chunked_ratios(loaded, long_tokens: int, runs: int, sizes: BenchSizes) -> dict:
    """Short requests decoding when a long prompt arrives; token budget 128, chunking on over off."""
    num_short, short_tokens, short_new = sizes.chunked_short_requests, sizes.chunked_short_prompt_tokens, sizes.chunked_short_new_tokens
    workload = build_workload(
        loaded.tokenizer, num_short_requests=num_short, short_prompt_tokens=short_tokens, short_max_new_tokens=short_new,
        long_prompt_tokens=long_tokens, long_max_new_tokens=4, arrival_step=2, token_budget=128,
    )
    run_workload(loaded.model, workload, True)  # warm-up
    max_itl, total = [], []
    for _ in range(max(sizes.min_runs, runs // 2)):
        off = latency_summary(run_workload(loaded.model, workload, False))
        on = latency_summary(run_workload(loaded.model, workload, True))
        max_itl.append(on.itl_max_ms / off.itl_max_ms)
        total.append(on.total_ms / off.total_ms)
    return {
        "workload": f"{num_short} requests decoding ({short_tokens}-token prompts, {short_new} new tokens) when a {long_tokens}-token prompt arrives; budget 128 vs no chunking",
        "max_itl_ratio": statistics.median(max_itl),
        "total_time_ratio": statistics.median(total),
        "max_itl_ratios": median_and_spread(max_itl),
        "total_time_ratios": median_and_spread(total),
    }
