"""The ``prefill`` action: the whole prompt in one step (a timing pass, then an inspection pass)."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.engine.config import EngineConfig
from prefillviz.experiments.prefill import one_step_budget, run_prefill
from prefillviz.figures import prefill as prefill_figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import PROMPT_PARAMETERS, make_outcome, prompt_of
from prefillviz.machine.progress import FractionProgress


def _run_prefill(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    prompt, preset = prompt_of(parameters)
    report(0.0, "prefill: a timing pass, then an inspection pass")
    budget = parameters.get("token_budget")  # kv_memory runs this too, without one
    result = run_prefill(loaded, prompt) if budget is None else run_prefill(loaded, prompt, token_budget=budget)
    record = result.timing.requests[result.request_id]
    forward_s = sum(step.forward_time_s for step in result.timing.steps)
    parts = record.ttft_breakdown_s
    measured = {
        "num_tokens": result.num_tokens,
        "num_steps": result.timing.num_steps,
        "ttft_ms": parts["total_s"] * 1e3,
        "forward_ms": parts["forward_s"] * 1e3,
        "forward_share_percent": 100 * parts["forward_s"] / parts["total_s"],
        "prefill_tokens_per_s": result.num_tokens / forward_s,
        "token_budget": budget or one_step_budget(loaded),  # None: the model's context, one step for any prompt
        "engine_default_budget": EngineConfig.token_budget,  # what an engine built without a budget gets
    }
    facts = [
        ("Prompt tokens", f"{result.num_tokens:,}"),
        ("Engine steps to the first token", f"{result.timing.num_steps}"),
        ("Time to first token", f"{measured['ttft_ms']:,.1f} ms"),
        ("Forward pass", f"{measured['forward_ms']:,.1f} ms"),
        ("First token", repr(record.first_token_text)),
    ]
    return make_outcome(
        "prefill", loaded, parameters, measured, facts, {"prefill": result}, prompt=prompt, preset=preset
    )


def _ttft_breakdown_figure(outcome: ActionOutcome) -> go.Figure:
    result = outcome.raw["prefill"]
    return prefill_figures.ttft_breakdown_figure(result.timing.requests[result.request_id].ttft_breakdown_s)


KIND = ActionKind(
    name="prefill",
    parameters={**PROMPT_PARAMETERS, "token_budget": (int, None)},
    scaled={},
    measured=(
        "num_tokens", "num_steps", "ttft_ms", "forward_ms", "forward_share_percent", "prefill_tokens_per_s",
        "token_budget", "engine_default_budget",
    ),
    figures={"ttft_breakdown": _ttft_breakdown_figure},
    run=_run_prefill,
    description="One parallel prefill of the prompt (timing pass, then inspection pass); the Prefill page shows it.",
    # the page draws one pass
    page_results=lambda run, label: {"prefill": run.raw["prefill"]} if run.measured["num_steps"] == 1 else {},
)
