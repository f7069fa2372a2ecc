"""The keys of ``python -m prefillviz bench --json``, declared once: the bench fills exactly
these, in this order; the tests check its JSON against them; the key table of
``docs/BENCHMARKS.md`` is printed from them (``python -m prefillviz.measure.bench_keys``) and a
test keeps it so."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchKey:
    name: str
    meaning: str
    kind: str = "figure"  # "setting": what was measured; "figure": a measured number; "vllm": a figure against vLLM (null without it); "record"


SETTINGS = "setting"
FIGURE = "figure"
VLLM = "vllm"
RECORD = "record"

BENCH_KEYS: tuple[BenchKey, ...] = (
    BenchKey("quick", "true for `--quick`, which runs every part on the least work that fills every key (one cold start, a 64-token inspect, 2 short peer prompts, ...), for the test of the JSON: its figures mean nothing", SETTINGS),
    BenchKey("model", "the model measured", SETTINGS),
    BenchKey("device", "the device", SETTINGS),
    BenchKey("dtype", "the dtype (`auto` resolved)", SETTINGS),
    BenchKey("torch_threads", "torch's intra-op threads", SETTINGS),
    BenchKey("num_tokens", "N, the prompt length of the prefill figures", SETTINGS),
    BenchKey("overhead_vs_hf", "engine parallel prefill (one step, N tokens: schedule + pack + forward + sample) over the plain HF forward of the same tokens with `logits_to_keep=1`, same model and dtype; median of per-pair ratios. On a CPU the engine's linears run pre-packed and HF's stock (`details.packed_weights` measures that difference alone). Target <= 1.10."),
    BenchKey("sequential_over_parallel", "the same N tokens token by token (`token_budget=1`, N steps) over one parallel step"),
    BenchKey("prefill_tok_s", "N / median engine parallel prefill time"),
    BenchKey("timing_overhead", "engine parallel prefill with the `timing` capture over the same with none. Target <= 1.10."),
    BenchKey("inspect_overhead", "the same with the `inspect` capture. Target <= 1.5."),
    BenchKey("inspect_4096_peak_rss_mb", "peak RSS of a fresh process that loads the model and inspects a 4,096-token prefill. Target < 3,072 on CPU."),
    BenchKey("gemm_peak_gflops", "the machine's matmul peak for this device and dtype: the best of the prefill-shaped matmul microbenchmark (`measure.peaks`; on a CPU each shape is timed both as `torch.mm` and with the weight pre-packed, as the engine runs it), measured once between each pair of prefill runs of this bench, median (the app's roofline uses the copy cached per machine in `$PREFILLVIZ_CACHE/peaks/`)"),
    BenchKey("prefill_achieved_gflops", "model FLOPs of the N-token prefill (projections, causal attention, MLP, one lm_head row) / median engine prefill time"),
    BenchKey("prefill_fraction_of_peak", "`prefill_achieved_gflops` / `gemm_peak_gflops`"),
    BenchKey("sequential_over_hf_decode", "our token-by-token run over HF's own one-token forwards into a `DynamicCache`, same N tokens: is the sequential baseline fair?"),
    BenchKey("prefix_hit_speedup", "TTFT of a 2N-token cached prefix (1,024 at N=512) plus 32 new tokens: miss over hit"),
    BenchKey("cold_start_s", "a fresh `python -m prefillviz run` process, from spawning it until it prints its first token: start, import, load from the cached copy, prefill (with stock linears: `run` packs only when it decodes); median of 5. `details.cold_start_to_exit_s` also counts the interpreter's exit (~1 s of freeing torch's and transformers' modules), which comes after the token"),
    BenchKey("chunked_max_itl_ratio", "4 requests decoding when a 2N-token prompt (1,024 at N=512) arrives, token budget 128: max inter-token latency, chunking on over off"),
    BenchKey("chunked_total_time_ratio", "the same workload: time to finish all, chunking on over off"),
    BenchKey("engine_over_hf_cb", "8 requests, prompts of 64-1,024 tokens (scaled by N/512), 32 new tokens each, budget 512, greedy: transformers' `generate_batch` wall time over ours (`details.hf_continuous_batching` says how many outputs were equal)"),
    BenchKey("engine_over_vllm_prefill_512", "real vLLM (`make vllm`) over ours, same run, alternated: time to first token of one fresh N-token prompt (`measure/versus_vllm.py`); above 1 means ours is faster", VLLM),
    BenchKey("engine_over_vllm_prefill_2048", "the same for a 4N-token prompt", VLLM),
    BenchKey("engine_over_vllm_prefix_hit", "the same for a request whose 2N-token prefix an earlier request of its workload left in the cache, plus 32 new tokens", VLLM),
    BenchKey("engine_over_vllm_decode", "the same for the mean time between tokens of one request decoding 64 tokens", VLLM),
    BenchKey("vllm_outputs_equal", "requests of a mixed batch of 8 (64-1,024 tokens) whose greedy tokens are the same on both; `details.vllm.mixed_batch` also compares prefix hits and the schedule. Without `.venv-vllm`, or with `--no-vllm`, the five vLLM keys are `null` and `details.vllm.skipped` says why", VLLM),
    BenchKey("dispatch", "what the engine ran: the measured choice per step shape, and its timings", RECORD),
    BenchKey("details", "every timing's median, min, max and run count; `details.machine_load`: how busy the machine was during the timed parts (other processes' CPU time as a share of all cores, from psutil)", RECORD),
)
KEY_NAMES: tuple[str, ...] = tuple(key.name for key in BENCH_KEYS)
VLLM_KEYS: tuple[str, ...] = tuple(key.name for key in BENCH_KEYS if key.kind == VLLM)


def in_order(values: dict) -> dict:
    """``values`` in the declared order; raises ``KeyError`` naming what is missing or not declared."""
    missing, extra = [k for k in KEY_NAMES if k not in values], [k for k in values if k not in KEY_NAMES]
    if missing or extra:
        raise KeyError(f"the bench's keys differ from BENCH_KEYS: missing {missing}, not declared {extra}")
    return {name: values[name] for name in KEY_NAMES}


def markdown_table() -> str:
    """The key table of ``docs/BENCHMARKS.md``."""
    rows = ["| key | what it measures |", "|---|---|"]
    rows += [f"| `{key.name}` | {key.meaning} |" for key in BENCH_KEYS]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
