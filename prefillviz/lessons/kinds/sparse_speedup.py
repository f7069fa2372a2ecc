"""The ``sparse_speedup`` action: block-sparse prefill against dense on a long prompt of real prose
(``experiments.sparse_prefill``), and the end-to-end speedup Amdahl's law allows from attention's
measured share of the dense time to first token."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.experiments.sparse_prefill import DEFAULT_KEEP_FRACTION, GREEDY_TOKENS, compare_dense_sparse
from prefillviz.figures import long_prompts as long_prompt_figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import make_outcome
from prefillviz.lessons.spec import LessonError
from prefillviz.machine.progress import FractionProgress


def _run_sparse_speedup(
    loaded, parameters: dict, report: FractionProgress, scale: float | None = None
) -> ActionOutcome:
    num_tokens, context = parameters["num_tokens"], loaded.info.max_context
    if context and num_tokens + GREEDY_TOKENS > context:
        raise LessonError(f"sparse_speedup: {loaded.model_id}'s context ({context:,}) is shorter than {num_tokens:,} "
                          f"prompt tokens + {GREEDY_TOKENS} generated.")
    result = compare_dense_sparse(loaded, num_tokens, (DEFAULT_KEEP_FRACTION,), parameters["runs"], report)[0]
    measured = {
        "num_tokens": result.num_tokens,
        "key_blocks_skipped_percent": 100 * (1 - result.keep_fraction),
        "attention_flops_skipped_percent": 100 * result.attention_flops_skipped_fraction,
        "scoring_flops_percent": 100 * result.scoring_flops_fraction,
        "dense_ttft_s": result.dense_ttft_s,
        "sparse_ttft_s": result.sparse_ttft_s,
        "dense_attention_s": result.dense_attention_s,
        "sparse_attention_s": result.sparse_attention_s,
        "sparse_ttft_speedup": result.ttft_speedup,
        "sparse_attention_speedup": result.attention_speedup,
        "attention_share_of_ttft_percent": 100 * result.attention_share,
        "amdahl_cap": result.amdahl_skip_cap,
        "amdahl_cap_no_attention": result.amdahl_cap,
        "speedup_over_amdahl_cap": result.ttft_speedup / result.amdahl_skip_cap,
        "first_token_kl": result.first_token_kl,
        "top1_agree": float(result.top1_agree),
    }
    facts = [
        ("Prompt", f"the first {result.num_tokens:,} tokens of {result.prompt_text} ({result.dtype})"),
        ("Skipped", f"{1 - result.keep_fraction:.0%} of each query block's key blocks: "
                    f"{result.attention_flops_skipped_fraction:.1%} of attention's FLOPs; the scoring adds "
                    f"{result.scoring_flops_fraction:.1%} of them"),
        ("Time to first token, dense → block-sparse",
         f"{result.dense_ttft_s:,.2f} s → {result.sparse_ttft_s:,.2f} s: {result.ttft_speedup:.2f}×"),
        ("Attention alone, dense → block-sparse",
         f"{result.dense_attention_s:,.2f} s → {result.sparse_attention_s:,.2f} s: {result.attention_speedup:.2f}×"),
        ("Attention's share of the dense TTFT", f"{result.attention_share:.1%}"),
        ("Amdahl's cap for this skip: 1 / (1 − share × skipped)", f"{result.amdahl_skip_cap:.2f}×"),
        ("With no attention at all: 1 / (1 − share)", f"{result.amdahl_cap:.2f}×"),
        ("First token", f"{'the same' if result.top1_agree else 'another'} as dense; KL {result.first_token_kl:.2g} "
                        f"nats (the same on {result.top1_agree_prompts} of {result.quality_prompts} stretches of "
                        "the book)"),
        ("Timed", f"median of {result.runs} run(s) each, after one untimed run of each with {GREEDY_TOKENS} "
                  f"generated tokens; {result.backend}"),
    ]
    return make_outcome("sparse_speedup", loaded, parameters, measured, facts, {"sparse_speedup": result})


def _ttft_figure(outcome: ActionOutcome) -> go.Figure:
    return long_prompt_figures.dense_sparse_ttft_figure(outcome.raw["sparse_speedup"])


KIND = ActionKind(
    name="sparse_speedup",
    parameters={"num_tokens": (int, 4096), "runs": (int, 1)},
    scaled={"num_tokens": 512},  # four 128-token blocks: the sparse path runs
    measured=(
        "num_tokens", "key_blocks_skipped_percent", "attention_flops_skipped_percent", "scoring_flops_percent",
        "dense_ttft_s", "sparse_ttft_s",
        "dense_attention_s", "sparse_attention_s", "sparse_ttft_speedup", "sparse_attention_speedup",
        "attention_share_of_ttft_percent", "amdahl_cap", "amdahl_cap_no_attention", "speedup_over_amdahl_cap",
        "first_token_kl", "top1_agree",
    ),
    figures={"dense_sparse_ttft": _ttft_figure},
    run=_run_sparse_speedup,
    description="Block-sparse prefill against dense on a long prompt: TTFT, attention, and Amdahl's cap.",
    page_results=lambda run, label: {"long_trade": [run.raw["sparse_speedup"]]},  # the page's trade-off table
)
