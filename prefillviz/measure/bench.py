"""``python -m prefillviz bench``: the engine's cost against the plain HF forward.

Timing discipline (gpt-fast / nanoGPT ``bench.py``): warm up first, synchronize the device
before reading the clock, interleave the runs being compared so drift hits both, report
medians with their spread. Every figure is measured in this run; nothing is remembered.
The parts in a fresh process (cold start, the inspection's peak RSS) are in
``fresh_process``; the peer, transformers' own continuous batching, in ``hf_batching``; the other parts in
``bench_parts``.

``--quick`` (``QUICK_SIZES``) runs every part on the smallest work that still fills
every key, for the test of the JSON's keys and shape; its figures say nothing and the JSON
says ``"quick": true``. The figures are ``make bench``'s (``FULL_SIZES``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from transformers import DynamicCache

from prefillviz.analysis.flops import engine_step_costs
from prefillviz.backends.dispatch_tables import summary as dispatch_summary
from prefillviz.experiments.chunked import WORKLOAD_DEFAULTS, WorkloadSettings
from prefillviz.experiments.one_request import OnePrompt
from prefillviz.loading.models import load_model
from prefillviz.loading.prompts import bench_token_ids
from prefillviz.machine.devices import dtype_name
from prefillviz.machine.load import MachineLoad
from prefillviz.machine.timers import median_and_spread, run_timed
from prefillviz.measure.bench_keys import VLLM_KEYS, in_order
from prefillviz.measure.bench_parts import chunked_ratios, packed_over_stock, prefix_hit_speedup
from prefillviz.measure.fresh_process import cold_start_s, inspect_peak_rss_mb
from prefillviz.measure.hf_batching import engine_over_hf_cb
from prefillviz.measure.long_prompts import bench_sparse_part
from prefillviz.measure.peaks import measure_matmul_gflops
from prefillviz.measure.peaks_history import machine_peaks
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
    vllm_rounds: int = 5  # timed rounds side by side with vLLM (each: every workload on ours, then on vLLM)
    chunked: WorkloadSettings = replace(  # short requests decoding when a 2N-token prompt arrives
        WORKLOAD_DEFAULTS, num_short_requests=4, short_prompt_tokens=32, short_max_new_tokens=24, token_budget=128
    )


FULL_SIZES = BenchSizes()  # make bench
QUICK_SIZES = BenchSizes(  # bench --quick: the test of the JSON's keys and shape
    warmup_runs=1, min_runs=1, cold_start_runs=1, inspect_rss_tokens=64, peer_prompt_lengths=(64, 256),
    peer_new_tokens=4, peer_rounds=1, peer_cache_blocks=8, vllm_rounds=1,
    chunked=replace(WORKLOAD_DEFAULTS, num_short_requests=2, short_prompt_tokens=8, short_max_new_tokens=4,
                    token_budget=128),
)


def run_bench(
    model_id: str, device: str, dtype: str, num_tokens: int = 512, runs: int = 7, quick: bool = False,
    with_vllm: bool = True, loaded=None
) -> dict:
    """Measure and return the benchmark figures: the keys of ``bench_keys.BENCH_KEYS``, in their order.

    Args:
        quick: every part on ``QUICK_SIZES``: the same keys, no figures to read.
        with_vllm: False leaves out the side-by-side with vLLM (its keys are None, with the reason).
        loaded: the model already loaded (the command line loads it to check the sizes first); None loads it.
    """
    sizes = QUICK_SIZES if quick else FULL_SIZES
    loaded = loaded or load_model(model_id, device=device, dtype=dtype)
    machine = MachineLoad()  # how busy the machine was while the figures were measured
    with machine:
        prefill = _prefill_timings(loaded, num_tokens, runs, sizes)
        prefix = prefix_hit_speedup(loaded, 2 * num_tokens, runs)
        packing = packed_over_stock(loaded, num_tokens, runs)
        chunked = chunked_ratios(loaded, 2 * num_tokens, max(sizes.min_runs, runs // 2), sizes.chunked)
        inspect_rss_mb = inspect_peak_rss_mb(model_id, device, dtype, sizes.inspect_rss_tokens)
        cold_starts, cold_exits = zip(*(cold_start_s(model_id, device, dtype) for _ in range(sizes.cold_start_runs)))
        peer = engine_over_hf_cb(
            loaded, num_tokens, sizes.peer_prompt_lengths, sizes.peer_new_tokens, sizes.peer_rounds,
            sizes.peer_cache_blocks
        )  # transformers' continuous batching sizes a large cache
        sparse = bench_sparse_part(loaded, quick)  # block-sparse prefill against dense, on the measured backend
        versus_vllm = (  # last: it starts vLLM
            vllm_side_by_side(loaded, num_tokens, sizes.vllm_rounds, quick) if with_vllm
            else vllm_skipped("--no-vllm: the comparison with vLLM was left out")
        )

    times = prefill
    ratios = [p / h for p, h in zip(times["parallel"], times["hf"])]
    parallel_median = statistics.median(times["parallel"])
    prefill_flops = engine_step_costs(loaded.model, num_tokens, num_tokens).total_flops
    gemm_gflops = statistics.median(times["gemm_gflops"])
    peaks = machine_peaks(loaded.device, loaded.dtype)
    return in_order({
        "quick": quick,
        "model": loaded.model_id,
        "device": str(loaded.device),
        "dtype": dtype_name(loaded.dtype),
        "torch_threads": torch.get_num_threads(),
        "num_tokens": num_tokens,
        "overhead_vs_hf": statistics.median(ratios),
        "sequential_over_parallel": statistics.median(times["sequential"]) / parallel_median,
        "prefill_tok_s": num_tokens / parallel_median,
        "timing_overhead": statistics.median(t / p for t, p in zip(times["timing"], times["parallel"])),
        "inspect_overhead": statistics.median(t / p for t, p in zip(times["inspect"], times["parallel"])),
        "inspect_4096_peak_rss_mb": inspect_rss_mb,
        "gemm_peak_gflops": gemm_gflops,
        "prefill_achieved_gflops": prefill_flops / parallel_median / 1e9,
        "prefill_fraction_of_peak": prefill_flops / parallel_median / 1e9 / gemm_gflops,
        "sequential_over_hf_decode": statistics.median(times["sequential"]) / statistics.median(times["hf_sequential"]),
        "prefix_hit_speedup": prefix["speedup"],
        "cold_start_s": statistics.median(cold_starts),
        "chunked_max_itl_ratio": chunked["max_itl_ratio"],
        "chunked_total_time_ratio": chunked["total_time_ratio"],
        "engine_over_hf_cb": peer["speedup"],
        "sparse_attention_speedup_4096": sparse["speedup"],
        "sparse_first_token_kl_4096": sparse["kl"],
        **{key: versus_vllm[key] for key in VLLM_KEYS},
        # what the engine ran: the measured choice per step shape, and its timings
        "dispatch": dispatch_summary(loaded.model),
        "details": {
            "vllm": versus_vllm["details"],
            "hf_forward_s": median_and_spread(times["hf"]),
            "engine_parallel_prefill_s": median_and_spread(times["parallel"]),
            "engine_token_by_token_s": median_and_spread(times["sequential"]),
            "overhead_vs_hf_ratios": median_and_spread(ratios),
            "hf_token_by_token_s": median_and_spread(times["hf_sequential"]),
            "prefix_hit": prefix,
            "packed_weights": packing,
            "chunked": chunked,
            "hf_continuous_batching": peer,
            "sparse_prefill_4096": sparse["details"],
            "cold_start": "fresh process: import, load the model from the prefillviz cache, first token of a short "
                          "prompt (until it prints it)",
            "cold_start_s": median_and_spread(list(cold_starts)),
            "cold_start_to_exit_s": median_and_spread(list(cold_exits)),
            "engine_timing_capture_s": median_and_spread(times["timing"]),
            "engine_inspect_capture_s": median_and_spread(times["inspect"]),
            "prefill_flops": prefill_flops,
            "gemm_gflops": median_and_spread(times["gemm_gflops"]),
            "machine_peaks": {  # the cached peaks the app's roofline uses, for comparison
                "matmul_gflops": peaks.matmul_gflops, "memory_gb_s": peaks.memory_gb_s,
                "measured_at": peaks.measured_at, "machine": peaks.machine,
            },
            "inspect_rss": f"fresh process: load the model, inspect-capture a {sizes.inspect_rss_tokens}-token "
                           "prefill, peak RSS",
            "warmup_runs": sizes.warmup_runs,
            "machine_load": machine.reading.as_dict(),  # other processes' share of the cores during the timed parts
        },
    })


def _prefill_timings(loaded, num_tokens: int, runs: int, sizes: BenchSizes) -> dict[str, list[float]]:
    """The N-token prefill's variants, interleaved so drift hits every one alike: HF's forward, the
    engine's parallel step (no capture, timing, inspect), both token by token, and the matmul
    peak the prefill is held against, measured between its runs. Seconds (GFLOP/s for the peak)."""
    model, device = loaded.model, loaded.device
    token_ids = bench_token_ids(loaded.tokenizer, num_tokens)
    input_ids = torch.tensor([token_ids], device=device)

    @torch.inference_mode()
    def hf_forward() -> None:
        model(input_ids=input_ids, logits_to_keep=1).logits.argmax(-1).item()

    def engine_prefill(token_budget: int, capture_level: str = "none") -> Callable[[], object]:
        # cache off: every run computes
        return OnePrompt(model, loaded.tokenizer, token_ids, token_budget, capture_level, model_id=loaded.model_id)

    @torch.inference_mode()
    def hf_token_by_token() -> None:  # HF's own decode loop: one token at a time into a DynamicCache
        cache = DynamicCache(config=model.config)
        for position in range(num_tokens):
            model(input_ids=input_ids[:, position : position + 1], cache=cache, use_cache=True, logits_to_keep=1)

    budget = max(num_tokens, 2048)
    variants = {"hf": hf_forward, "parallel": engine_prefill(budget), "timing": engine_prefill(budget, "timing"),
                "inspect": engine_prefill(budget, "inspect")}
    # N steps each: fewer runs
    sequential = {"sequential": engine_prefill(token_budget=1), "hf_sequential": hf_token_by_token}
    for _ in range(sizes.warmup_runs):
        for fn in variants.values():
            fn()
    for fn in sequential.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in ("gemm_gflops", *variants, *sequential)}
    for i in range(runs):
        times["gemm_gflops"].append(measure_matmul_gflops(device, loaded.dtype, runs=1))
        for name, fn in variants.items():
            times[name].append(run_timed(fn, device)[0])
        if i < max(sizes.min_runs, runs // 2):
            for name, fn in sequential.items():
                times[name].append(run_timed(fn, device)[0])
    return times
