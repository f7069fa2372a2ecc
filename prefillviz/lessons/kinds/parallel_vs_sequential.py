"""The ``parallel_vs_sequential`` action: the same prompt in one step and in N one-token steps."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.analysis.flop_facts import token_by_token_flops
from prefillviz.experiments import parallel
from prefillviz.figures import parallel as parallel_figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import PROMPT_PARAMETERS, make_outcome, prompt_of
from prefillviz.machine.progress import FractionProgress


def _run_parallel(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    prompt, _ = prompt_of(parameters)
    comparison = parallel.run_both_ways(
        loaded, prompt, max_tokens=parameters["num_tokens"], parallel_timing_runs=parameters["parallel_timing_runs"],
        progress=report,
    )
    check = comparison.equality
    diff = max(check.max_key_diff, check.max_value_diff)
    flops = token_by_token_flops(loaded, comparison.num_tokens)  # the FLOP model: every one-token step computes logits
    measured = {
        "num_tokens": comparison.num_tokens,
        "parallel_ttft_ms": comparison.parallel.time_to_first_token_s * 1e3,
        "token_by_token_ttft_ms": comparison.token_by_token.time_to_first_token_s * 1e3,
        "ratio": comparison.ratio,
        "token_by_token_steps": comparison.token_by_token.num_steps,
        "max_kv_diff": diff,
        "kv_relative_diff": check.relative_diff,
        "kv_diff_over_tolerance": check.relative_diff / check.relative_tolerance,
        "relative_tolerance": check.relative_tolerance,
        "flop_extra_percent": 100 * (flops.extra_work - 1),
        "parallel_over_step_flops": flops.parallel_over_mean_step,
        "logits_max_abs_diff": check.logits_max_abs_diff,
        "same_top_token": float(check.parallel_top_token_id == check.token_by_token_top_token_id),
    }
    facts = [
        ("Prompt tokens", f"{comparison.num_tokens:,}"),
        ("Parallel: time to first token", f"{measured['parallel_ttft_ms']:,.1f} ms in 1 step"),
        (
            "Token-by-token: time to first token",
            f"{measured['token_by_token_ttft_ms']:,.1f} ms in {comparison.token_by_token.num_steps} steps",
        ),
        (
            "FLOPs: token-by-token over parallel (FLOP model)",
            f"{flops.extra_work:.2f}× (each one-token step computes a row of logits)",
        ),
        (
            "Largest K/V difference, relative to the layer's largest |K| or |V|",
            f"{check.relative_diff:.1e} (absolute {diff:.1e}; "
            f"tolerance {check.relative_tolerance:.1e} in {check.dtype})",
        ),
        ("Same next token", "yes" if measured["same_top_token"] else "no"),
    ]
    return make_outcome("parallel_vs_sequential", loaded, parameters, measured, facts, {"parallel": comparison})


def _step_latency_figure(outcome: ActionOutcome) -> go.Figure:
    return parallel_figures.step_latency_figure(outcome.raw["parallel"])


def _kv_difference_figure(outcome: ActionOutcome) -> go.Figure:
    return parallel_figures.kv_difference_figure(outcome.raw["parallel"].equality)


KIND = ActionKind(
    name="parallel_vs_sequential",
    parameters={
        **PROMPT_PARAMETERS, "preset": (str, "Long document"), "num_tokens": (int, 400),
        "parallel_timing_runs": (int, 3),
    },
    scaled={"num_tokens": 8},
    measured=(
        "num_tokens", "parallel_ttft_ms", "token_by_token_ttft_ms", "ratio", "token_by_token_steps", "max_kv_diff",
        "kv_diff_over_tolerance", "logits_max_abs_diff", "same_top_token", "kv_relative_diff", "relative_tolerance",
        "flop_extra_percent", "parallel_over_step_flops",
    ),
    figures={"step_latency": _step_latency_figure, "kv_difference": _kv_difference_figure},
    run=_run_parallel,
    description=(
        "The prompt's first N tokens in one step and in N one-token steps: timed, then their KV caches compared."
    ),
    page_results=lambda run, label: {"parallel": run.raw["parallel"]},
)
