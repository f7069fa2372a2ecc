"""``scripts/gpu_check.sh``: one prepared run of the GPU checks, printing JSON figures.

On a CUDA machine (an H200 class GPU, no network), in bf16:

    prefill       engine prefill tok/s at several N for the bundled model (when its cached
                  copy or package is there) and for a random-weight model of
                  Llama-3.2-1B's shape; achieved TFLOP/s (FLOPs from analysis.flops) and MFU
                  against the bf16 matmul peak measured in this run
    clocks        per-layer CUDA-event times against the profiler's device span of the same
                  ``layers.i`` scopes, inside each of 3 profile passes (the same launches on
                  both clocks); the timing passes' events against them, and the kernels'
                  busy time, printed beside it
    kernels       the paged kernels (v2 loop, v3 packed, v4 flex, v5 triton) checked
                  against the oracle and timed vs N on the Llama shape; Triton over SDPA

``--self-test`` runs the same code on the CPU with tiny sizes (and the Triton kernel under
its interpreter when Triton is installed): it proves the script works before GPU time is
spent on it. Every check prints ``"ok": true/false``; the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import statistics
import sys

SELF_TEST = "--self-test" in sys.argv
if SELF_TEST:  # must precede the Triton kernel's import: @triton.jit reads it when it decorates
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from prefillviz.analysis.flops import engine_step_costs
from prefillviz.engine.request import SamplingParams
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.instrument.capture import run_captured
from prefillviz.kernels import paged_attention as paged
from prefillviz.machine.devices import dtype_name, machine_name
from prefillviz.machine.timers import run_timed
from prefillviz.measure.kernel_bench import run_kernel_benchmark
from prefillviz.measure.peaks import measure_matmul_gflops
from prefillviz.measure.trace_spans import median_per_layer, median_ratio, scope_spans_s

LLAMA_3_2_1B = dict(  # meta-llama/Llama-3.2-1B's config.json, the shape only (random weights)
    hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
    head_dim=64, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
    rms_norm_eps=1e-5,
)
TINY_LLAMA = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=32, vocab_size=512, max_position_embeddings=1024, tie_word_embeddings=True,
)
GPU_SIZES = {"prefill": (512, 2048, 8192), "kernels": (512, 1024, 2048, 4096, 8192)}
SELF_TEST_SIZES = {"prefill": (32, 64), "kernels": (32, 48)}
CLOCKS_AGREE = (0.8, 1.25)  # CUDA-event layer time / the profiler's device span of the same layer scope, in one pass
CLOCK_PASSES = 3  # profile passes and timing passes each; medians


class _Tokenizer:
    """Enough of a tokenizer for the engine on a random-weight model: ids in, ids out."""

    eos_token_id = None

    def decode(self, ids, **kwargs) -> str:
        return " ".join(map(str, ids))


def _emit(record: dict) -> dict:
    print(json.dumps(record), flush=True)
    return record


def _prefill_s(name: str, model, tokenizer, token_ids: list[int], device: torch.device, capture_level: str = "none",
               profile_dir=None):
    """One prefill on a fresh one-request engine: (seconds of its run, device synchronized around it; its trace)."""
    engine = one_request_engine(model, tokenizer, token_budget=16384, num_tokens=len(token_ids) + 1, model_id=name)
    engine.add_request(token_ids, SamplingParams(max_new_tokens=1))
    return run_timed(lambda: run_captured(engine, capture_level=capture_level, profile_dir=profile_dir), device)


# a prefill can't beat the matmul peak measured on the same device; above this, a clock is wrong
MAX_PLAUSIBLE_MFU = 1.05


def sizes_within_context(model, sizes) -> tuple[list[int], int]:
    """``sizes`` with every N past the model's context capped to it: (the sizes, the context).

    A prefill of N tokens samples one more, so N + 1 must fit in ``max_position_embeddings``
    (the engine's ``request_checks`` refuses it otherwise).
    """
    context = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    if context <= 1:
        return list(sizes), context
    return sorted({min(int(n), context - 1) for n in sizes}), context


def prefill_figures(name: str, model, tokenizer, sizes, device, peak_gflops: float, runs: int) -> list[dict]:
    """Prefill tok/s, achieved GFLOP/s and MFU (vs the measured peak) at each N (capped at the model's
    context, and said so): median of ``runs`` after a warm-up."""
    vocab = model.config.vocab_size
    records = []
    capped, context = sizes_within_context(model, sizes)
    if capped != sorted(sizes):
        records.append(_emit({"check": "prefill", "model": name,
                              "note": f"sizes {list(sizes)} capped at the context ({context:,} tokens, "
                                      f"one of them for the first new token): {capped}", "ok": True}))
    for n in capped:
        token_ids = torch.randint(10, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        _prefill_s(name, model, tokenizer, token_ids, device)  # warm-up
        results = [_prefill_s(name, model, tokenizer, token_ids, device) for _ in range(runs)]
        times = [seconds for seconds, _ in results]
        first_tokens = all(len(record.output_token_ids) == 1
                           for _, trace in results for record in trace.requests.values())
        median = statistics.median(times)
        flops = engine_step_costs(model, n, n).total_flops
        achieved = flops / median / 1e9
        mfu = achieved / peak_gflops
        records.append(_emit({
            "check": "prefill", "model": name, "N": n, "tok_s": n / median, "median_s": median, "min_s": min(times),
            "max_s": max(times), "runs": runs, "achieved_gflops": achieved, "mfu_vs_measured_peak": mfu,
            # every run produced its first token, and on a GPU no faster than the measured matmul peak allows (else a
            # clock is wrong); on a shared CPU (the self-test) a peak measured in a busy moment may be beaten in a
            # quiet one
            "ok": first_tokens and (device.type != "cuda" or mfu <= MAX_PLAUSIBLE_MFU),
        }))
    return records


def clock_agreement(name: str, model, tokenizer, n: int, device: torch.device, profile_dir: str,
                    passes: int = CLOCK_PASSES) -> dict:
    """Per-layer CUDA-event times against the profiler's spans of the same ``layers.i`` scopes.

    Like with like: every pass runs the engine's own forward (the profile level opens its
    ``record_function`` scopes inside it, around the same spans a timing pass times), and the events
    are compared with the scope's device-side span, which holds the launch gaps the events also count.

    The check is made inside each profile pass: its spans record the CUDA events too, so both
    clocks see the very same launches and gaps. Across passes (the timing passes' events against
    the profile passes' spans, medians of ``passes`` each) the gaps differ where the host is slow
    and busy (an H200's first run: the GPU idle 17% of a layer on one machine, 47% on another);
    that ratio is printed beside it, with the kernels' busy time and the idle share of each side,
    but it does not decide. On a CPU (the self-test) the profiler side is the scope's CPU span,
    and the check only shows the plumbing works.
    """
    token_ids = torch.randint(10, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    _prefill_s(name, model, tokenizer, token_ids, device)  # warm-up
    timing = [_prefill_s(name, model, tokenizer, token_ids, device, "timing")[1].steps[0].layer_times
              for _ in range(passes)]
    profiled = [_prefill_s(name, model, tokenizer, token_ids, device, "profile", profile_dir)[1]
                for _ in range(passes)]
    num_layers = len(timing[0].layer_s)
    timing_events = median_per_layer([t.layer_s for t in timing])
    pass_events, pass_spans, pass_busy, same_pass = [], [], [], []
    for trace in profiled:
        events = trace.steps[0].layer_times.layer_s
        spans, span_kind = scope_spans_s(gzip.decompress(trace.profile.chrome_trace_gz), num_layers)
        table = {row["op"]: row for row in trace.profile.op_table}
        busy = [table.get(f"layers.{i}", {}).get("device_total_s", 0.0) for i in range(num_layers)]
        pass_events.append(events)
        pass_spans.append(spans)
        pass_busy.append(busy)
        same_pass.append(median_ratio(events, spans))
    spans, busy = median_per_layer(pass_spans), median_per_layer(pass_busy)
    ratio = statistics.median(same_pass)
    cuda = device.type == "cuda"

    def idle(total: list[float]) -> float | None:
        return 1 - sum(busy) / sum(total) if cuda and sum(total) > 0 else None

    return _emit({
        "check": "clocks", "model": name, "N": n, "clock": timing[0].clock,
        "forward": "stock transformers forward in every pass",
        "profiler_side": ("device span of the scope and its nested scopes (gpu_user_annotation)"
                          if span_kind == "gpu_user_annotation" else "scope CPU span (self-test)"),
        "passes": passes,
        "decides": "same_pass_ratio: each profile pass's layer clock (CUDA events on a GPU) over its own profiler "
                   "spans",
        "same_pass_ratio": ratio, "same_pass_ratios": same_pass,
        "profile_pass_event_layers_ms": [sum(e) * 1e3 for e in pass_events],
        "profile_pass_span_layers_ms": [sum(s) * 1e3 for s in pass_spans],
        "timing_pass_event_layers_ms": [sum(t.layer_s) * 1e3 for t in timing],
        "across_passes_ratio": median_ratio(timing_events, spans),
        "kernel_busy_layers_ms": sum(busy) * 1e3,
        "idle_share_timing_passes": idle(timing_events), "idle_share_profile_passes": idle(spans),
        "ok": not math.isnan(ratio) and (not cuda or CLOCKS_AGREE[0] <= ratio <= CLOCKS_AGREE[1]),
    })


def kernel_figures(shape: tuple[int, int, int], sizes, device, dtype, runs: int) -> list[dict]:
    """The paged kernels on the Llama shape: each checked, then timed; Triton and packed over the loop."""
    records = []
    triton_runs, triton_reason = paged.TRITON.status(str(device))
    if device.type != "cuda":  # the self-test: Triton is checked under its interpreter, not timed
        if triton_runs:
            inputs = paged.random_step([(20, 1), (0, 23), (31, 12)], *shape, block_size=16, seed=5, workload="mixed")
            difference, allowed = paged.check_paged(paged.TRITON, inputs)
            records.append(_emit({"check": "triton", "mode": triton_reason, "max_abs_diff": difference,
                                  "allowed": allowed, "ok": True}))
        else:
            records.append(_emit({"check": "triton", "skipped": triton_reason, "ok": True}))
    bench = run_kernel_benchmark(*shape, sizes, device, dtype, families=("paged",), include_flex=device.type == "cuda",
                                 runs=runs)
    by_point: dict[tuple, dict] = {}
    for row in bench.rows():
        by_point.setdefault((row["workload"], row["N"]), {})[row["kernel"]] = row["median_ms"]
    for (workload, n), times in by_point.items():
        loop = times.get("v2 loop")
        records.append(_emit({
            "check": "kernels", "workload": workload, "N": n, "median_ms": times,
            "triton_over_loop": times["v5 triton"] / loop if "v5 triton" in times else None,
            "packed_over_loop": times["v3 packed"] / loop, "ok": True,
        }))
    for skip in bench.skipped:
        records.append(_emit({"check": "kernels", "skipped": skip, "ok": True}))
    if device.type == "cuda" and not triton_runs:
        records.append(_emit({"check": "triton", "skipped": triton_reason, "ok": False}))
    return records


def _guarded(check: str, run) -> list[dict]:
    """``run()``'s records; an exception becomes one failed record with its message, and the next
    check goes on: one broken check must not cost the rest of a GPU run's figures."""
    try:
        return run()
    except Exception as error:  # noqa: BLE001 -- reported as a failed check, with the error
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [_emit({"check": check, "error": f"{type(error).__name__}: {error}"[:500], "ok": False})]


def _bundled(device: torch.device, dtype: torch.dtype):
    from prefillviz.loading.model_registry import BUNDLED_MODEL_ID
    from prefillviz.loading.models import load_model

    try:
        return load_model(BUNDLED_MODEL_ID, device=str(device), dtype=dtype_name(dtype))
    except Exception as error:  # noqa: BLE001 -- no bundled copy on this machine is a skip, said why
        _emit({"check": "prefill", "model": BUNDLED_MODEL_ID, "skipped": f"{type(error).__name__}: {error}"[:300],
               "ok": True})
        return None


def device_for(self_test: bool) -> tuple[torch.device, torch.dtype] | None:
    """(device, dtype) of a GPU run (CUDA, bf16) or of its self-test (the CPU, fp32); None, with the
    message on stderr, where there is no GPU and no self-test was asked for."""
    if not self_test and not torch.cuda.is_available():
        print("error: no CUDA GPU here; run with --self-test for the CPU-side check", file=sys.stderr)
        return None
    return (torch.device("cpu"), torch.float32) if self_test else (torch.device("cuda"), torch.bfloat16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self-test", action="store_true", help="tiny sizes on the CPU: check the script itself")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile-dir", default="out/gpu_check_profile")
    args = parser.parse_args(argv)
    if (chosen := device_for(args.self_test)) is None:
        return 2
    device, dtype = chosen
    sizes = SELF_TEST_SIZES if args.self_test else GPU_SIZES
    runs = 2 if args.self_test else args.runs
    torch.manual_seed(0)
    peak = measure_matmul_gflops(device, dtype, runs=3)
    records = [_emit({
        "check": "machine", "name": machine_name(device), "device": str(device), "dtype": dtype_name(dtype),
        "torch": torch.__version__, "cuda": torch.version.cuda, "matmul_peak_gflops": peak, "ok": peak > 0,
    })]
    bundled = _bundled(device, dtype)
    if bundled is not None:
        model_id, model, tokenizer = bundled.model_id, bundled.model, bundled.tokenizer
        records += _guarded("prefill", lambda: prefill_figures(model_id, model, tokenizer, sizes["prefill"], device,
                                                               peak, runs))
        clock_n = sizes_within_context(model, sizes["prefill"])[0][-1]
        records += _guarded("clocks", lambda: [clock_agreement(model_id, model, tokenizer, clock_n, device,
                                                               args.profile_dir)])
        del bundled, model
    config = LlamaConfig(**(TINY_LLAMA if args.self_test else LLAMA_3_2_1B))
    llama = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    name = "random Llama-3.2-1B shape" if not args.self_test else "random tiny Llama"
    records += _guarded("prefill", lambda: prefill_figures(name, llama, _Tokenizer(), sizes["prefill"], device, peak,
                                                           runs))
    records += _guarded("clocks", lambda: [clock_agreement(name, llama, _Tokenizer(), sizes["prefill"][1], device,
                                                           args.profile_dir)])
    shape = (config.num_attention_heads, config.num_key_value_heads, config.head_dim)
    records += _guarded("kernels", lambda: kernel_figures(shape, sizes["kernels"], device, dtype, runs))
    failed = [r for r in records if not r["ok"]]
    _emit({"check": "summary", "records": len(records), "failed": len(failed), "ok": not failed})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
