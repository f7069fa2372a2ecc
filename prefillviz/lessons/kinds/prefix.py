"""The ``prefix`` action: questions sharing a prefix, one after another on one engine, prefix cache on vs off."""

from __future__ import annotations

import statistics

import plotly.graph_objects as go

from prefillviz.experiments import prefix
from prefillviz.experiments.outputs import compare_outputs
from prefillviz.figures import prefix as prefix_figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import labelled_page_results, make_outcome, outputs_fact
from prefillviz.lessons.spec import LessonError
from prefillviz.machine.progress import FractionProgress

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
        raise LessonError(
            "prefix: needs at least 2 questions (the first computes the prefix, the later ones can hit it)."
        )
    stream = prefix.build_stream(
        loaded.tokenizer, prefix_text, questions, template, parameters["max_new_tokens"], other_user_after=None
    )
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
        "later_cached_percent": statistics.mean(
            100 * on[rid].num_cached_tokens / on[rid].num_prompt_tokens for rid in later
        ),
        "hit_rate_percent": 100 * hits / queries,
        "later_ttft_on_ms": ttft_on * 1e3,
        "later_ttft_off_ms": ttft_off * 1e3,
        "ttft_speedup": ttft_off / ttft_on,
        "outputs_identical": float(all(check.identical for check in checks)),
    }
    full_blocks, block_size = stream.num_shared_full_blocks, stream.block_size
    facts = [
        (
            "Shared prefix",
            f"{stream.num_shared_prefix_tokens:,} tokens: {full_blocks} full blocks of {block_size} + "
            f"{stream.num_shared_prefix_tokens - full_blocks * block_size}",
        ),
        ("Requests after the first: prompt tokens from the cache", f"{measured['later_cached_percent']:.0f}%"),
        ("Their time to first token, cache off → on", f"{ttft_off * 1e3:,.0f} ms → {ttft_on * 1e3:,.0f} ms"),
        ("prefix_cache_hits / prefix_cache_queries", f"{hits:,} / {queries:,} tokens"),
        outputs_fact(measured),
    ]
    return make_outcome("prefix", loaded, parameters, measured, facts, {"prefix": experiment})


def _prefix_ttft_figure(outcome: ActionOutcome) -> go.Figure:
    return prefix_figures.ttft_figure(
        outcome.raw["prefix"], "Time to first token of each request, prefix cache on vs off"
    )


KIND = ActionKind(
    name="prefix",
    parameters={
        "shared_prefix": (str, "Questions about one long document"), "num_questions": (int, 3),
        "max_new_tokens": (int, 2), "prefix_tokens": (int, None),
    },
    scaled={"prefix_tokens": SMALLEST_SCALED_PREFIX_TOKENS},
    measured=(
        "num_shared_prefix_tokens", "later_cached_percent", "hit_rate_percent", "later_ttft_on_ms", "later_ttft_off_ms",
        "ttft_speedup", "outputs_identical",
    ),
    figures={"ttft": _prefix_ttft_figure},
    run=_run_prefix,
    description="Questions sharing a prefix, one after another on one engine, with the prefix cache on and off.",
    page_results=labelled_page_results("prefix", "experiment"),
)
