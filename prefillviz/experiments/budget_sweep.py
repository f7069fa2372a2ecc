"""The chunked-prefill workload at several token budgets: the trade-off a budget sets.

One run with chunking off, then the chunked run at each budget (``experiments.chunked``), on
the same tokens, greedy, timing pass. A small budget keeps every decode's inter-token latency
low and stretches the long prompt's TTFT over many steps; a large one does the opposite:

    budget    long prompt's TTFT    decodes' max ITL
    small     long (many chunks)    short
    large     short (few chunks)    long (one big step stalls them)

Every run's tokens are compared with the chunking-off run's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from prefillviz.experiments.chunked import ChunkedWorkload, LatencySummary, latency_summary, run_workload
from prefillviz.experiments.outputs import compare_outputs
from prefillviz.experiments.warm_up import short_warm_up
from prefillviz.machine.progress import StepProgress, offset_progress


@dataclass
class BudgetPoint:
    """One run of the budget sweep: the workload at one token budget (or with chunking off)."""

    token_budget: int
    enable_chunked_prefill: bool
    summary: LatencySummary
    outputs_match_off: bool  # every request's tokens equal the chunking-off run's


@dataclass
class BudgetSweep:
    workload: ChunkedWorkload
    model_id: str
    device: str
    dtype: str
    points: list[BudgetPoint]  # the chunking-off point first, then budgets ascending


def budget_sweep(
    model, workload: ChunkedWorkload, budgets: list[int], progress: StepProgress | None = None, model_id: str = ""
) -> BudgetSweep:
    """The workload with chunking off once, then chunked at each budget: (TTFT, max ITL) per run.

    Raises:
        ConfigError: a budget that is not a positive whole number.
    """
    workloads = [replace(workload, token_budget=int(b)) for b in sorted(set(budgets))]  # validates every budget first
    short_warm_up(model)
    off = run_workload(model, workload, False, progress, model_id)
    points = [BudgetPoint(workload.token_budget, False, latency_summary(off), True)]
    steps_done = off.num_steps
    for chunked in workloads:
        trace = run_workload(model, chunked, True, offset_progress(progress, steps_done), model_id)
        steps_done += trace.num_steps
        same = all(check.identical for check in compare_outputs(off, trace))
        points.append(BudgetPoint(chunked.token_budget, True, latency_summary(trace), same))
    return BudgetSweep(workload, model_id, off.device, off.dtype, points)


def estimated_sweep_steps(workload: ChunkedWorkload, budgets: list[int]) -> int:
    total = workload.estimated_num_steps(False)
    for budget in budgets:
        if isinstance(budget, int) and budget > 0:
            total += replace(workload, token_budget=budget).estimated_num_steps(True)
    return total
