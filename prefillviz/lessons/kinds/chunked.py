"""The ``chunked`` action: a long prompt arrives while short requests decode; chunking off vs on."""

from __future__ import annotations

import statistics

import plotly.graph_objects as go

from prefillviz.experiments import chunked
from prefillviz.experiments.chunked import WORKLOAD_DEFAULTS
from prefillviz.figures import chunked as chunked_figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import labelled_page_results, make_outcome, outputs_fact
from prefillviz.machine.progress import FractionProgress

# this action's and disagg's
WORKLOAD_PARAMETERS = {name: (int, value) for name, value in WORKLOAD_DEFAULTS.as_dict().items()}


def chunked_workload(loaded, parameters: dict) -> chunked.ChunkedWorkload:
    """The chunked-prefill workload a lesson step names (also the disaggregation step's)."""
    return chunked.build_workload(
        loaded.tokenizer, **{name: parameters[name] for name in chunked.WORKLOAD_DEFAULTS.as_dict()}
    )


def gap_spanning_arrival_ms(trace) -> float:
    """The decoding users' gap between the two tokens around the long prompt's arrival (ms, mean
    over the users still decoding then): the one gap the long prefill can stretch, a single
    measured gap per user instead of the worst of all gaps, which one hiccup of a shared machine decides."""
    arrival = trace.requests[chunked.LONG_REQUEST_ID].arrival_time_s
    gaps = []
    for request_id in chunked.short_request_ids(trace):
        record = trace.requests[request_id]
        t = record.arrival_time_s + record.time_to_first_token_s
        for gap in record.inter_token_times_s:
            if t <= arrival < t + gap:
                gaps.append(gap * 1000)
            t += gap
    return statistics.mean(gaps) if gaps else float("nan")


def _run_chunked(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    workload = chunked_workload(loaded, parameters)
    total = workload.estimated_num_steps(False) + workload.estimated_num_steps(True)

    def progress(done: int, record) -> None:
        report(min(1.0, done / total), f"chunking off, then on: step {done} of ~{total}")

    comparison = chunked.compare_chunking(loaded.model, workload, progress, loaded.model_id)
    off, on = comparison.summary_off, comparison.summary_on
    gap_off, gap_on = gap_spanning_arrival_ms(comparison.off), gap_spanning_arrival_ms(comparison.on)
    measured = {
        "arrival_gap_off_ms": gap_off,
        "arrival_gap_on_ms": gap_on,
        "arrival_gap_ratio": gap_off / gap_on,
        "itl_max_off_ms": off.itl_max_ms,
        "itl_max_on_ms": on.itl_max_ms,
        "itl_max_ratio": off.itl_max_ms / on.itl_max_ms,
        "long_ttft_off_ms": off.long_ttft_ms,
        "long_ttft_on_ms": on.long_ttft_ms,
        "long_ttft_ratio": on.long_ttft_ms / off.long_ttft_ms,
        "num_steps_off": off.num_steps,
        "num_steps_on": on.num_steps,
        "extra_steps_on": on.num_steps - off.num_steps,
        "outputs_identical": float(all(check.identical for check in comparison.output_checks)),
    }
    facts = [
        (
            "A decoding user's gap across the long prompt's arrival, chunking off → on",
            f"{gap_off:,.1f} ms → {gap_on:,.1f} ms",
        ),
        ("Worst gap between tokens of a decoding user, chunking off", f"{off.itl_max_ms:,.0f} ms"),
        ("… with chunking on", f"{on.itl_max_ms:,.0f} ms"),
        ("Long prompt's TTFT, off → on", f"{off.long_ttft_ms:,.0f} ms → {on.long_ttft_ms:,.0f} ms"),
        ("Engine steps, off → on", f"{off.num_steps} → {on.num_steps}"),
        outputs_fact(measured),
    ]
    return make_outcome("chunked", loaded, parameters, measured, facts, {"chunked": comparison})


def _chunked_latency_figure(outcome: ActionOutcome) -> go.Figure:
    comparison = outcome.raw["chunked"]
    summaries = {"chunking off": comparison.summary_off, "chunking on": comparison.summary_on}
    return chunked_figures.latency_figure(
        summaries, "Decoding users' inter-token latency (ITL) and the long prompt's TTFT"
    )


KIND = ActionKind(
    name="chunked",
    parameters=WORKLOAD_PARAMETERS,
    scaled={"short_max_new_tokens": 4, "long_prompt_tokens": 16, "token_budget": 8},
    measured=(
        "arrival_gap_off_ms", "arrival_gap_on_ms", "arrival_gap_ratio", "itl_max_off_ms", "itl_max_on_ms",
        "itl_max_ratio", "long_ttft_off_ms", "long_ttft_on_ms", "long_ttft_ratio",
        "num_steps_off", "num_steps_on", "extra_steps_on", "outputs_identical",
    ),
    figures={"latency": _chunked_latency_figure},
    run=_run_chunked,
    description="A long prompt arriving while short requests decode, with chunked prefill off and on.",
    page_results=labelled_page_results("chunked", "comparison"),
)
