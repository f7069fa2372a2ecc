"""The ``papers_chunk_cost`` action: prompts prefilled whole and in chunks (Sarathi-Serve, Figure 9a);
each chunk size's overhead over the whole prefill."""

from __future__ import annotations

import statistics

import plotly.graph_objects as go

from prefillviz.experiments import papers_published as published
from prefillviz.experiments.papers_chunk_cost import run_chunk_cost
from prefillviz.figures import papers as figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import labelled_page_results, papers_outcome
from prefillviz.lessons.spec import LessonError
from prefillviz.machine.progress import FractionProgress


def paper_overhead(chunk_size: int) -> float:
    """Figure 9a's overhead of one chunk size, averaged over its prompt lengths."""
    return statistics.mean(r["relative"] for r in published.chunk_cost_rows() if r["chunk_size"] == chunk_size)


def _run(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    result = run_chunk_cost(loaded, parameters["prompt_sizes"], parameters["chunk_sizes"], parameters["runs"], report)
    sizes = result.chunk_sizes
    if len(sizes) < 2:
        raise LessonError("papers_chunk_cost: needs at least 2 chunk sizes smaller than a prompt.")
    smallest, largest = result.mean_overhead(sizes[0]), result.mean_overhead(sizes[-1])
    measured = {
        "smallest_chunk": sizes[0], "largest_chunk": sizes[-1],
        "smallest_chunk_overhead_percent": 100 * (smallest - 1), "largest_chunk_overhead_percent": 100 * (largest - 1),
        "overhead_falls": float(smallest > largest),
        "paper_512_overhead_percent": 100 * (paper_overhead(512) - 1),
        "paper_2048_overhead_percent": 100 * (paper_overhead(2048) - 1),
    }
    facts = [
        (
            f"Chunks of {c:,}: time over the whole prefill",
            f"{result.mean_overhead(c):.2f}× (mean over the prompt lengths)",
        )
        for c in sizes
    ]
    facts += [
        (
            "The paper (Yi-34B, A100s): chunks of 512, of 2,048",
            f"{paper_overhead(512):.2f}×, {paper_overhead(2048):.2f}×",
        ),
    ]
    return papers_outcome("papers_chunk_cost", loaded, parameters, measured, facts, result, "chunk_cost")


def _figure(outcome: ActionOutcome) -> go.Figure:
    return figures.chunk_cost_figure(
        outcome.raw["papers_chunk_cost"], "Prefill in chunks: time over the whole prefill's"
    )


KIND = ActionKind(
    name="papers_chunk_cost",
    parameters={"prompt_sizes": (list, [512, 1024]), "chunk_sizes": (list, [64, 128, 256, 512]), "runs": (int, 2)},
    scaled={"prompt_sizes": 32, "chunk_sizes": 16},
    measured=(
        "smallest_chunk", "largest_chunk", "smallest_chunk_overhead_percent", "largest_chunk_overhead_percent",
        "overhead_falls", "paper_512_overhead_percent", "paper_2048_overhead_percent",
    ),
    figures={"overhead": _figure},
    run=_run,
    description=(
        "Prompts prefilled whole and in chunks: each chunk size's time over the whole prefill "
        "(Sarathi-Serve Figure 9a)."
    ),
    page_results=labelled_page_results("papers_chunk_cost", "result"),
)
