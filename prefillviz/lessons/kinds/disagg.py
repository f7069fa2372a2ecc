"""The ``disagg`` action: the chunked-prefill workload on one engine (chunking off, on) and on a
prefill worker + a decode worker (``disagg.experiment``), and the figures its step can show."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.analysis import flop_facts
from prefillviz.disagg.experiment import SETUPS, compare_setups
from prefillviz.experiments import chunked
from prefillviz.figures import chunked as chunked_figures
from prefillviz.figures import disagg as disagg_figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.chunked import WORKLOAD_PARAMETERS, chunked_workload
from prefillviz.lessons.kinds.common import labelled_page_results, make_outcome, outputs_fact
from prefillviz.machine.progress import FractionProgress

DISAGG_MEASURED = (
    "itl_max_off_ms", "itl_max_on_ms", "itl_max_disagg_ms", "long_ttft_off_ms", "long_ttft_on_ms",
    "long_ttft_disagg_ms", "disagg_itl_growth", "kv_mb_sent_long", "transfer_ms_long", "outputs_identical",
    "disagg_ttft_ratio", "placement_kind", "long_prompt_tokens", "kv_bytes_per_token", "attention_share_percent",
    "attention_crossover_tokens",
)
# placement_kind 0, 1, 2
PLACEMENTS = ("CPU cores split between the workers", "one GPU shared, K/V through host memory", "a GPU each")


def placement_kind(devices: tuple[str, str]) -> int:
    """0: both workers on the CPU (they split its cores); 1: both on one GPU; 2: one device each."""
    if devices[0] != devices[1]:
        return 2
    return 0 if devices[0] == "cpu" else 1


def _run_disagg(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    workload = chunked_workload(loaded, parameters)
    total = workload.estimated_num_steps(False) + workload.estimated_num_steps(True)

    def progress(done: int, record) -> None:
        report(min(0.5, done / total / 2), f"one engine, chunking off, then on: step {done} of ~{total}")

    comparison = compare_setups(loaded, workload, progress)
    report(1.0, "the prefill and decode workers are done")
    off, on, disagg = (comparison.summaries[name] for name in SETUPS)
    long = next(t for t in comparison.disagg.transfers if t.request_id == chunked.LONG_REQUEST_ID)
    measured = {
        "itl_max_off_ms": off.itl_max_ms, "itl_max_on_ms": on.itl_max_ms, "itl_max_disagg_ms": disagg.itl_max_ms,
        "long_ttft_off_ms": off.long_ttft_ms, "long_ttft_on_ms": on.long_ttft_ms,
        "long_ttft_disagg_ms": disagg.long_ttft_ms,
        "disagg_itl_growth": comparison.itl_growth(), "kv_mb_sent_long": long.num_bytes / 1e6,
        "transfer_ms_long": long.transfer_s * 1000,
        "outputs_identical": float(comparison.outputs_equal),
        "disagg_ttft_ratio": disagg.long_ttft_ms / off.long_ttft_ms,
        "placement_kind": placement_kind(comparison.disagg.spec.placement.devices),
        "long_prompt_tokens": len(workload.long_prompt),
        "kv_bytes_per_token": comparison.kv_bytes_per_token,
        # bytes sent grow like N; the prefill's FLOPs like N plus attention's N²: its share says which wins
        "attention_share_percent": 100 * flop_facts.attention_share(loaded, len(workload.long_prompt)),
        "attention_crossover_tokens": flop_facts.attention_crossover_tokens(loaded),
    }
    facts = [
        (
            "Worst gap of a decoding user: chunking off, on, disaggregated",
            f"{off.itl_max_ms:,.0f} ms, {on.itl_max_ms:,.0f} ms, {disagg.itl_max_ms:,.0f} ms",
        ),
        (
            "Disaggregated: worst gap after the long prompt arrived, over the median gap",
            f"{measured['disagg_itl_growth']:.1f}×",
        ),
        (
            "Long prompt's TTFT: chunking off, on, disaggregated",
            f"{off.long_ttft_ms:,.0f} ms, {on.long_ttft_ms:,.0f} ms, {disagg.long_ttft_ms:,.0f} ms",
        ),
        (
            "Its KV cache sent to the decode worker",
            f"{measured['kv_mb_sent_long']:,.1f} MB in {measured['transfer_ms_long']:,.1f} ms",
        ),
        ("Placement", comparison.disagg.spec.placement.label),
        ("Threads", comparison.threads_label),
        outputs_fact(measured),
    ]
    return make_outcome("disagg", loaded, parameters, measured, facts, {"disagg": comparison})


def _disagg_gaps_figure(outcome: ActionOutcome) -> go.Figure:
    return disagg_figures.gaps_figure(
        outcome.raw["disagg"], "The decoding users' gaps between tokens, around the long prompt's arrival"
    )


def _disagg_latency_figure(outcome: ActionOutcome) -> go.Figure:
    return chunked_figures.latency_figure(
        outcome.raw["disagg"].summaries, "One engine (chunking off, on) vs disaggregated (ms)"
    )


KIND = ActionKind(
    name="disagg",
    parameters=WORKLOAD_PARAMETERS,
    scaled={"short_max_new_tokens": 4, "long_prompt_tokens": 16, "token_budget": 8},
    measured=DISAGG_MEASURED,
    figures={"gaps": _disagg_gaps_figure, "latency": _disagg_latency_figure},
    run=_run_disagg,
    description="The chunked workload on one engine (chunking off, on), then on a prefill worker and a decode worker.",
    page_results=labelled_page_results("disagg", "comparison"),
)
