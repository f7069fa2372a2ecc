"""The ``kv_memory`` action: one prefill read as KV-cache memory (write log, blocks, GQA)."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.analysis.flop_facts import tokens_to_match_weights
from prefillviz.analysis.memory import kv_memory_report
from prefillviz.analysis.model_shape import model_shape
from prefillviz.experiments import inspect_run, kv_memory
from prefillviz.figures import kv_cache as kv_figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import PROMPT_PARAMETERS, make_outcome
from prefillviz.lessons.kinds.prefill import _run_prefill
from prefillviz.machine.progress import FractionProgress


def _run_kv_memory(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    outcome = _run_prefill(loaded, parameters, report)
    run = inspect_run.from_prefill_result(outcome.raw["prefill"])
    growth = kv_memory.memory_growth(run.trace, run.request_id)
    formula = kv_memory_report(
        kv_memory.shape_of_trace(run.trace, run.request_id), dtype=run.trace.dtype, num_tokens=run.num_tokens
    )
    usage = kv_memory.block_usage(run.trace, run.request_id, run.num_tokens)
    written = float(growth.bytes_written[-1])  # what the layers really wrote (the KV write log)
    per_token = written / run.num_tokens
    weight_bytes = sum(p.numel() * p.element_size() for p in loaded.model.parameters())  # tied tensors counted once
    context = model_shape(loaded).max_context or run.num_tokens
    measured = {
        "num_tokens": run.num_tokens,
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_token_formula": formula.bytes_per_token,
        "kv_total_mb": written / 1e6,
        "num_blocks": len(usage.block_ids),
        "block_size": usage.block_size,
        "mha_bytes_per_token": formula.mha_bytes_per_token,
        "gqa_saving_factor": formula.mha_bytes_per_token / per_token,
        "max_context": context,
        "kv_at_context_mb": per_token * context / 1e6,
        "weights_mb": weight_bytes / 1e6,
        "kv_at_context_over_weights": per_token * context / weight_bytes,
        "tokens_to_match_weights": tokens_to_match_weights(weight_bytes, per_token),
    }
    facts = [
        ("Prompt tokens", f"{run.num_tokens:,} ({formula.dtype})"),
        ("Written per token (KV write log)", f"{per_token:,.0f} B"),
        ("The formula", formula.formula),
        ("The whole prompt", f"{written / 1e6:,.2f} MB in {len(usage.block_ids)} blocks of {usage.block_size} tokens"),
        ("With one KV head per query head (MHA)", f"{formula.mha_bytes_per_token:,} B per token"),
        (
            f"One request at the model's whole context ({context:,} tokens)",
            f"{per_token * context / 1e6:,.0f} MB of KV cache",
        ),
        ("The model's weights", f"{weight_bytes / 1e6:,.0f} MB"),
    ]
    raw = {**outcome.raw, "growth": growth, "report": formula}
    return make_outcome(
        "kv_memory", loaded, parameters, measured, facts, raw, prompt=outcome.prompt, preset=outcome.preset
    )


def _memory_growth_figure(outcome: ActionOutcome) -> go.Figure:
    return kv_figures.memory_growth_figure(outcome.raw["growth"])


def _gqa_figure(outcome: ActionOutcome) -> go.Figure:
    return kv_figures.gqa_bars_figure(outcome.raw["report"])


KIND = ActionKind(
    name="kv_memory",
    parameters=PROMPT_PARAMETERS,
    scaled={},
    measured=(
        "num_tokens", "kv_bytes_per_token", "kv_bytes_per_token_formula", "kv_total_mb", "num_blocks", "block_size",
        "mha_bytes_per_token", "gqa_saving_factor", "max_context", "kv_at_context_mb", "weights_mb",
        "tokens_to_match_weights", "kv_at_context_over_weights",
    ),
    figures={"memory_growth": _memory_growth_figure, "gqa_bars": _gqa_figure},
    run=_run_kv_memory,
    description="One prefill read as KV-cache memory: the bytes the layers wrote, the blocks, what GQA saves.",
    page_results=lambda run, label: {"prefill": run.raw["prefill"]},
)
