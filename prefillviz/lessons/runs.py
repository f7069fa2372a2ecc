"""The real model runs behind each action kind: one ``_run_<kind>(loaded, parameters, report,
scale)`` per kind, each returning an ``ActionOutcome`` of measured numbers by name, facts and
the raw experiment results (``registry.ACTION_KINDS`` names them).
"""

from __future__ import annotations

import statistics

from prefillviz.analysis.memory import kv_memory_report
from prefillviz.engine.devices import dtype_name
from prefillviz.engine.progress import FractionProgress
from prefillviz.experiments import chunked, inspect_run, kv_memory, parallel, prefix
from prefillviz.experiments.one_request import run_one
from prefillviz.experiments.outputs import compare_outputs
from prefillviz.experiments.prefill import run_prefill
from prefillviz.lessons.actions import ActionOutcome
from prefillviz.lessons.spec import LessonError
from prefillviz.loading.prompts import PRESETS, bench_token_ids
from prefillviz.measure.roofline import run_roofline


def _outcome(kind: str, loaded, parameters: dict, measured: dict, facts: list, raw: dict, **extra) -> ActionOutcome:
    return ActionOutcome(
        kind=kind,
        parameters=parameters,
        measured={name: float(value) for name, value in measured.items()},
        facts=facts,
        raw=raw,
        model_id=loaded.model_id,
        device=str(loaded.device),
        dtype=dtype_name(loaded.dtype),
        **extra,
    )


def _prompt_of(parameters: dict) -> tuple[str, str | None]:
    """(prompt text, preset name or None): a spec's own ``prompt`` wins over its ``preset``."""
    if parameters.get("prompt"):
        return parameters["prompt"], None
    return PRESETS[parameters["preset"]], parameters["preset"]


# --- prefill: the whole prompt in one step (a timing pass, then an inspection pass)
def _run_prefill(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    prompt, preset = _prompt_of(parameters)
    report(0.0, "prefill: a timing pass, then an inspection pass")
    result = run_prefill(loaded, prompt)
    record = result.timing.requests[result.request_id]
    parts = record.ttft_breakdown_s
    measured = {
        "num_tokens": result.num_tokens,
        "num_steps": result.timing.num_steps,
        "ttft_ms": parts["total_s"] * 1e3,
        "forward_ms": parts["forward_s"] * 1e3,
        "forward_share_percent": 100 * parts["forward_s"] / parts["total_s"],
        "prefill_tokens_per_s": result.num_tokens / result.timing.steps[0].forward_time_s,
    }
    facts = [
        ("Prompt tokens", f"{result.num_tokens:,}"),
        ("Engine steps to the first token", f"{result.timing.num_steps}"),
        ("Time to first token", f"{measured['ttft_ms']:,.1f} ms"),
        ("Forward pass", f"{measured['forward_ms']:,.1f} ms"),
        ("First token", repr(record.first_token_text)),
    ]
    return _outcome("prefill", loaded, parameters, measured, facts, {"prefill": result}, prompt=prompt, preset=preset)


# --- kv_memory: the same prefill, read as KV-cache memory (write log, blocks, GQA)
def _run_kv_memory(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    outcome = _run_prefill(loaded, parameters, report)
    run = inspect_run.from_prefill_result(outcome.raw["prefill"])
    growth = kv_memory.memory_growth(run.trace, run.request_id)
    formula = kv_memory_report(kv_memory.shape_of_trace(run.trace, run.request_id), dtype=run.trace.dtype, num_tokens=run.num_tokens)
    usage = kv_memory.block_usage(run.trace, run.request_id, run.num_tokens)
    written = float(growth.bytes_written[-1])  # what the layers really wrote (the KV write log)
    per_token = written / run.num_tokens
    measured = {
        "num_tokens": run.num_tokens,
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_token_formula": formula.bytes_per_token,
        "kv_total_mb": written / 1e6,
        "num_blocks": len(usage.block_ids),
        "block_size": usage.block_size,
        "mha_bytes_per_token": formula.mha_bytes_per_token,
        "gqa_saving_factor": formula.mha_bytes_per_token / per_token,
    }
    facts = [
        ("Prompt tokens", f"{run.num_tokens:,} ({formula.dtype})"),
        ("Written per token (KV write log)", f"{per_token:,.0f} B"),
        ("The formula", formula.formula),
        ("The whole prompt", f"{written / 1e6:,.2f} MB in {len(usage.block_ids)} blocks of {usage.block_size} tokens"),
        ("With one KV head per query head (MHA)", f"{formula.mha_bytes_per_token:,} B per token"),
    ]
    raw = {**outcome.raw, "growth": growth, "report": formula}
    return _outcome("kv_memory", loaded, parameters, measured, facts, raw, prompt=outcome.prompt, preset=outcome.preset)


# --- ttft_ratio: the time to first token of a short and a long prompt of real prose
def _ttft_s(loaded, token_ids: list[int]) -> float:
    """One parallel prefill of ``token_ids`` on a fresh engine (prefix cache off): its TTFT."""
    trace, request_id = run_one(loaded.model, loaded.tokenizer, token_ids, max(len(token_ids), 16), model_id=loaded.model_id)
    return trace.requests[request_id].time_to_first_token_s


def _run_ttft_ratio(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    short_n, long_n, runs = parameters["short_tokens"], parameters["long_tokens"], parameters["runs"]
    if long_n <= short_n:
        raise LessonError(f"ttft_ratio: long_tokens ({long_n}) must be larger than short_tokens ({short_n}).")
    times: dict[int, list[float]] = {short_n: [], long_n: []}
    done, total = 0, 2 * (runs + 1)
    for n in (short_n, long_n):
        token_ids = bench_token_ids(loaded.tokenizer, n)
        for run in range(runs + 1):  # run 0 warms up this shape
            report(done / total, f"{n}-token prompt: run {run + 1} of {runs + 1} (the first warms up)")
            ttft = _ttft_s(loaded, token_ids)
            if run > 0:
                times[n].append(ttft)
            done += 1
    short_s, long_s = statistics.median(times[short_n]), statistics.median(times[long_n])
    measured = {
        "short_tokens": short_n,
        "long_tokens": long_n,
        "token_ratio": long_n / short_n,
        "short_ttft_ms": short_s * 1e3,
        "long_ttft_ms": long_s * 1e3,
        "ttft_ratio": long_s / short_s,
    }
    facts = [
        (f"TTFT, {short_n} tokens", f"{short_s * 1e3:,.1f} ms"),
        (f"TTFT, {long_n} tokens", f"{long_s * 1e3:,.1f} ms"),
        ("Tokens: long / short", f"{long_n / short_n:,.1f}×"),
        ("TTFT: long / short", f"{long_s / short_s:,.1f}×"),
    ]
    return _outcome("ttft_ratio", loaded, parameters, measured, facts, {"times": times})


# --- parallel_vs_sequential: the same prompt in one step and in N one-token steps
def _run_parallel(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    prompt, _ = _prompt_of(parameters)
    comparison = parallel.run_both_ways(
        loaded, prompt, max_tokens=parameters["num_tokens"], parallel_timing_runs=parameters["parallel_timing_runs"], progress=report
    )
    check = comparison.equality
    diff = max(check.max_key_diff, check.max_value_diff)
    measured = {
        "num_tokens": comparison.num_tokens,
        "parallel_ttft_ms": comparison.parallel.time_to_first_token_s * 1e3,
        "token_by_token_ttft_ms": comparison.token_by_token.time_to_first_token_s * 1e3,
        "ratio": comparison.ratio,
        "token_by_token_steps": comparison.token_by_token.num_steps,
        "max_kv_diff": diff,
        "kv_diff_over_tolerance": diff / check.tolerance,
        "logits_max_abs_diff": check.logits_max_abs_diff,
        "same_top_token": float(check.parallel_top_token_id == check.token_by_token_top_token_id),
    }
    facts = [
        ("Prompt tokens", f"{comparison.num_tokens:,}"),
        ("Parallel: time to first token", f"{measured['parallel_ttft_ms']:,.1f} ms in 1 step"),
        ("Token-by-token: time to first token", f"{measured['token_by_token_ttft_ms']:,.1f} ms in {comparison.token_by_token.num_steps} steps"),
        ("Largest K/V difference", f"{diff:.1e} (tolerance {check.tolerance:g} in {check.dtype})"),
        ("Same next token", "yes" if measured["same_top_token"] else "no"),
    ]
    return _outcome("parallel_vs_sequential", loaded, parameters, measured, facts, {"parallel": comparison})


# --- roofline: measured prefill and decode steps under this machine's measured roofs
def _run_roofline(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    report(0.0, "reading (or measuring) this machine's peaks, then timing prefill and decode steps")
    result = run_roofline(loaded, parameters["prefill_sizes"], parameters["decode_contexts"], parameters["runs"])
    prefill_points = [p for p in result.points if p.phase == "prefill"]
    decode_points = [p for p in result.points if p.phase == "decode"]
    if not prefill_points or not decode_points:
        raise LessonError("roofline: the model's context is too short for these prefill sizes and decode contexts.")
    prefill_point = max(prefill_points, key=lambda p: p.num_tokens)
    decode_point = min(decode_points, key=lambda p: p.context_len)
    peaks = result.peaks
    measured = {
        "prefill_tokens": prefill_point.num_tokens,
        "prefill_intensity": prefill_point.intensity,
        "decode_intensity": decode_point.intensity,
        "intensity_ratio": prefill_point.intensity / decode_point.intensity,
        "ridge_intensity": peaks.ridge_intensity,
        "prefill_over_ridge": prefill_point.intensity / peaks.ridge_intensity,
        "prefill_gflops": prefill_point.achieved_gflops,
        "decode_gflops": decode_point.achieved_gflops,
        "gflops_ratio": prefill_point.achieved_gflops / decode_point.achieved_gflops,
        "prefill_percent_of_peak": 100 * prefill_point.achieved_gflops / peaks.matmul_gflops,
    }
    facts = [
        (f"Prefill step, N={prefill_point.num_tokens}", f"{prefill_point.intensity:,.1f} FLOP/byte · {prefill_point.achieved_gflops:,.1f} GFLOP/s"),
        (f"Decode step, context {decode_point.context_len}", f"{decode_point.intensity:,.2f} FLOP/byte · {decode_point.achieved_gflops:,.1f} GFLOP/s"),
        ("Ridge point (where the roofs meet)", f"{peaks.ridge_intensity:,.1f} FLOP/byte"),
        (f"Prefill N={prefill_point.num_tokens}", _side_of_ridge(prefill_point.intensity, peaks.ridge_intensity)),
        (f"Decode, context {decode_point.context_len}", _side_of_ridge(decode_point.intensity, peaks.ridge_intensity)),
        ("This machine's roofs (measured)", f"{peaks.matmul_gflops:,.0f} GFLOP/s matmul · {peaks.memory_gb_s:,.1f} GB/s memory"),
    ]
    return _outcome("roofline", loaded, parameters, measured, facts, {"roofline": result})


def _side_of_ridge(intensity: float, ridge: float) -> str:
    if intensity >= ridge:
        return f"right of the ridge ({intensity / ridge:,.1f}× its intensity): compute-bound"
    return f"left of the ridge ({ridge / intensity:,.1f}× below it): memory-bound"


# --- chunked: a long prompt arrives while short requests decode; chunking off vs on
def chunked_workload(loaded, parameters: dict) -> chunked.ChunkedWorkload:
    """The chunked-prefill workload a lesson step names (also the disaggregation step's)."""
    names = ("num_short_requests", "short_prompt_tokens", "short_max_new_tokens", "long_prompt_tokens", "long_max_new_tokens", "arrival_step", "token_budget")
    return chunked.build_workload(loaded.tokenizer, **{name: parameters[name] for name in names})


def _run_chunked(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    workload = chunked_workload(loaded, parameters)
    total = workload.estimated_num_steps(False) + workload.estimated_num_steps(True)

    def progress(done: int, record) -> None:
        report(min(1.0, done / total), f"chunking off, then on: step {done} of ~{total}")

    comparison = chunked.compare_chunking(loaded.model, workload, progress, loaded.model_id)
    off, on = comparison.summary_off, comparison.summary_on
    measured = {
        "itl_max_off_ms": off.itl_max_ms,
        "itl_max_on_ms": on.itl_max_ms,
        "itl_max_ratio": off.itl_max_ms / on.itl_max_ms,
        "long_ttft_off_ms": off.long_ttft_ms,
        "long_ttft_on_ms": on.long_ttft_ms,
        "long_ttft_ratio": on.long_ttft_ms / off.long_ttft_ms,
        "num_steps_off": off.num_steps,
        "num_steps_on": on.num_steps,
        "outputs_identical": float(all(check.identical for check in comparison.output_checks)),
    }
    facts = [
        ("Worst gap between tokens of a decoding user, chunking off", f"{off.itl_max_ms:,.0f} ms"),
        ("… with chunking on", f"{on.itl_max_ms:,.0f} ms"),
        ("Long prompt's TTFT, off → on", f"{off.long_ttft_ms:,.0f} ms → {on.long_ttft_ms:,.0f} ms"),
        ("Engine steps, off → on", f"{off.num_steps} → {on.num_steps}"),
        ("Same tokens generated", "yes" if measured["outputs_identical"] else "no"),
    ]
    return _outcome("chunked", loaded, parameters, measured, facts, {"chunked": comparison})


# --- prefix: questions sharing a prefix, one after another on one engine, prefix cache on vs off
SMALLEST_SCALED_PREFIX_TOKENS = 40  # a scaled-down prefix keeps at least this many tokens (the registry's ``scaled``)


def _run_prefix(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    prefix_text, template = prefix.SHARED_PREFIXES[parameters["shared_prefix"]]
    prefix_ids = loaded.tokenizer(prefix_text)["input_ids"]
    keep = parameters["prefix_tokens"] or len(prefix_ids)
    if scale is not None and parameters["prefix_tokens"] is None:
        keep = max(SMALLEST_SCALED_PREFIX_TOKENS, round(len(prefix_ids) * scale))
    if keep < len(prefix_ids):  # the first tokens of the same text
        prefix_text = loaded.tokenizer.decode(prefix_ids[:keep])
    questions = list(prefix.QUESTIONS[: parameters["num_questions"]])
    if len(questions) < 2:
        raise LessonError("prefix: needs at least 2 questions (the first computes the prefix, the later ones can hit it).")
    stream = prefix.build_stream(loaded.tokenizer, prefix_text, questions, template, parameters["max_new_tokens"], other_user_after=None)
    total = prefix.estimated_num_steps(stream, False)

    def progress(done: int, record) -> None:
        report(min(1.0, done / total), f"cache on, then off: step {done} of ~{total}")

    experiment = prefix.run_prefix_experiment(loaded.model, stream, None, progress, loaded.model_id)
    later = stream.request_ids[1:]  # every request after the first can hit the prefix
    on, off = experiment.cache_on.trace.requests, experiment.cache_off.trace.requests
    ttft_on = statistics.mean(on[rid].time_to_first_token_s for rid in later)
    ttft_off = statistics.mean(off[rid].time_to_first_token_s for rid in later)
    queries, hits = experiment.cache_on.counters[-1]
    checks = compare_outputs(experiment.cache_off.trace, experiment.cache_on.trace)
    measured = {
        "num_shared_prefix_tokens": stream.num_shared_prefix_tokens,
        "later_cached_percent": statistics.mean(100 * on[rid].num_cached_tokens / on[rid].num_prompt_tokens for rid in later),
        "hit_rate_percent": 100 * hits / queries,
        "later_ttft_on_ms": ttft_on * 1e3,
        "later_ttft_off_ms": ttft_off * 1e3,
        "ttft_speedup": ttft_off / ttft_on,
        "outputs_identical": float(all(check.identical for check in checks)),
    }
    full_blocks, block_size = stream.num_shared_full_blocks, stream.block_size
    facts = [
        ("Shared prefix", f"{stream.num_shared_prefix_tokens:,} tokens: {full_blocks} full blocks of {block_size} + {stream.num_shared_prefix_tokens - full_blocks * block_size}"),
        ("Requests after the first: prompt tokens from the cache", f"{measured['later_cached_percent']:.0f}%"),
        ("Their time to first token, cache off → on", f"{ttft_off * 1e3:,.0f} ms → {ttft_on * 1e3:,.0f} ms"),
        ("prefix_cache_hits / prefix_cache_queries", f"{hits:,} / {queries:,} tokens"),
        ("Same tokens generated", "yes" if measured["outputs_identical"] else "no"),
    ]
    return _outcome("prefix", loaded, parameters, measured, facts, {"prefix": experiment})
