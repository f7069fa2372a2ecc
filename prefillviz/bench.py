"""``python -m prefillviz bench``: the engine's cost against the plain HF forward.

Timing discipline (gpt-fast / nanoGPT ``bench.py``): warm up first, synchronize the device
before reading the clock, interleave the runs being compared so drift hits both, report
medians with their spread. Every figure is measured in this run; nothing is remembered.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from prefillviz.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.models import load_model
from prefillviz.prompts import bench_token_ids

NUM_WARMUP = 2


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], None], device: torch.device) -> float:
    _synchronize(device)
    start = time.perf_counter()
    fn()
    _synchronize(device)
    return time.perf_counter() - start


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def run_bench(model_id: str, device: str, dtype: str, num_tokens: int = 512, runs: int = 7) -> dict:
    """Measure and return the benchmark figures (see the README for each key)."""
    loaded = load_model(model_id, device=device, dtype=dtype)
    model, device_ = loaded.model, loaded.device
    token_ids = bench_token_ids(loaded.tokenizer, num_tokens)
    input_ids = torch.tensor([token_ids], device=device_)

    @torch.inference_mode()
    def hf_forward() -> None:
        model(input_ids=input_ids, logits_to_keep=1).logits.argmax(-1).item()

    def engine_prefill(token_budget: int) -> Callable[[], None]:
        engine = LLMEngine(model, loaded.tokenizer, EngineConfig(token_budget=token_budget), model_id=loaded.model_id)

        def prefill() -> None:  # a fresh request each time; prefix caching off would be equivalent here
            engine.block_pool.cached_block_ids.clear()
            engine.add_request(token_ids)
            engine.run()

        return prefill

    parallel = engine_prefill(token_budget=max(num_tokens, 2048))
    sequential = engine_prefill(token_budget=1)

    for _ in range(NUM_WARMUP):
        hf_forward()
        parallel()
    sequential()

    hf_times, parallel_times, sequential_times = [], [], []
    for i in range(runs):  # interleaved
        hf_times.append(_time(hf_forward, device_))
        parallel_times.append(_time(parallel, device_))
        if i < max(3, runs // 2):  # N steps each: fewer runs
            sequential_times.append(_time(sequential, device_))

    ratios = [p / h for p, h in zip(parallel_times, hf_times)]
    parallel_median = statistics.median(parallel_times)
    return {
        "model": loaded.model_id,
        "device": str(device_),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "torch_threads": torch.get_num_threads(),
        "num_tokens": num_tokens,
        "overhead_vs_hf": statistics.median(ratios),
        "sequential_over_parallel": statistics.median(sequential_times) / parallel_median,
        "prefill_tok_s": num_tokens / parallel_median,
        "details": {
            "hf_forward_s": _spread(hf_times),
            "engine_parallel_prefill_s": _spread(parallel_times),
            "engine_token_by_token_s": _spread(sequential_times),
            "overhead_vs_hf_ratios": _spread(ratios),
            "warmup_runs": NUM_WARMUP,
        },
    }
