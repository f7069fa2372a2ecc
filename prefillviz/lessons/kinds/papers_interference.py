"""The ``papers_interference`` action: the Disaggregated page's three set-ups at two or more long-prompt
lengths (DistServe): the decoding users' worst gap over their median gap, and the crossover."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.disagg.experiment import SETUPS
from prefillviz.figures import papers as figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.chunked import WORKLOAD_PARAMETERS, chunked_workload
from prefillviz.lessons.kinds.common import labelled_page_results, papers_outcome
from prefillviz.lessons.kinds.disagg import placement_kind
from prefillviz.machine.progress import FractionProgress
from prefillviz.measure.papers_interference import run_interference

NONE = 0  # the crossover when disaggregation never beat chunking off


def _run(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    workload = chunked_workload(loaded, parameters)
    sweep = run_interference(loaded, workload, parameters["long_prompt_sizes"], report)
    largest = sweep.points[-1]
    crossover = sweep.crossover()
    measured = {
        "largest_long_prompt": largest.long_prompt_tokens,
        "interference_off": largest.interference(SETUPS[0]), "interference_on": largest.interference(SETUPS[1]),
        "interference_disagg": largest.interference(SETUPS[2]),
        "worst_gap_off_ms": largest.worst_gap_ms(SETUPS[0]), "worst_gap_disagg_ms": largest.worst_gap_ms(SETUPS[2]),
        "crossover_tokens": crossover if crossover is not None else NONE,
        "has_crossover": float(crossover is not None),
        "outputs_identical": float(all(p.comparison.outputs_equal for p in sweep.points)),
        "placement_kind": placement_kind(largest.comparison.disagg.spec.placement.devices),
    }
    facts = [
        (
            f"Long prompt {p.long_prompt_tokens:,}: worst gap, off / on / disaggregated",
            " / ".join(f"{p.worst_gap_ms(s):,.0f} ms" for s in SETUPS),
        )
        for p in sweep.points
    ]
    crossover_text = f"N = {crossover:,}" if crossover else "none of these lengths"
    facts.append(("Disaggregated beats one engine with chunking off from", crossover_text))
    facts.append(("Placement", largest.comparison.disagg.spec.placement.label))
    return papers_outcome(
        "papers_interference", loaded, parameters, measured, facts, sweep, "interference", "Source of the dashed line"
    )


def _figure(outcome: ActionOutcome) -> go.Figure:
    return figures.interference_figure(
        outcome.raw["papers_interference"], "Interference: the decoding users' worst gap over their median"
    )


def _gap_figure(outcome: ActionOutcome) -> go.Figure:
    return figures.worst_gap_figure(
        outcome.raw["papers_interference"], "The decoding users' worst gap, per set-up (ms)"
    )


KIND = ActionKind(
    name="papers_interference",
    parameters={**WORKLOAD_PARAMETERS, "long_prompt_sizes": (list, [64, 512])},
    scaled={"short_max_new_tokens": 4, "long_prompt_tokens": 16, "token_budget": 8, "long_prompt_sizes": 16},
    measured=(
        "largest_long_prompt", "interference_off", "interference_on", "interference_disagg", "worst_gap_off_ms",
        "worst_gap_disagg_ms", "crossover_tokens", "has_crossover", "outputs_identical", "placement_kind",
    ),
    figures={"interference": _figure, "worst_gap": _gap_figure},
    run=_run,
    description=(
        "The Disaggregated page's set-ups at several long-prompt lengths: interference and the crossover (DistServe)."
    ),
    page_results=labelled_page_results("papers_interference", "sweep"),
)
