"""The ``papers_chunk_cost`` action: prompts prefilled whole and in chunks (Sarathi-Serve, Figure 9a);
each chunk size's overhead over the whole prefill."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.experiments import papers_published as published
from prefillviz.experiments.papers_chunk_cost import run_chunk_cost
from prefillviz.figures import papers as figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import labelled_page_results, papers_outcome
from prefillviz.lessons.spec import LessonError
from prefillviz.machine.progress import FractionProgress


def paper_rows_by_length() -> dict[int, dict[int, float]]:
    """Figure 9a's rows: prompt length -> {chunk size: time over the whole prefill}, as published (not averaged:
    the chunk sizes rank differently at different lengths)."""
    rows: dict[int, dict[int, float]] = {}
    for row in published.chunk_cost_rows():
        rows.setdefault(row["prefill_tokens"], {})[row["chunk_size"]] = row["relative"]
    return rows


def paper_row_text(length: int, relative: dict[int, float]) -> str:
    """One prompt length's chunk sizes and their overhead; a chunk as long as the prompt is marked as whole."""
    whole = max(relative)
    return ", ".join(
        f"{chunk:,}: {100 * (value - 1):+.1f}%" + (" (the whole prompt in one chunk)" if chunk > length else "")
        for chunk, value in sorted(relative.items()) if chunk != whole
    )


def _run(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    result = run_chunk_cost(loaded, parameters["prompt_sizes"], parameters["chunk_sizes"], parameters["runs"], report)
    sizes = result.chunk_sizes
    if len(sizes) < 2:
        raise LessonError("papers_chunk_cost: needs at least 2 chunk sizes smaller than a prompt.")
    smallest, largest = result.mean_overhead(sizes[0]), result.mean_overhead(sizes[-1])
    paper = paper_rows_by_length()
    measured = {
        "smallest_chunk": sizes[0], "largest_chunk": sizes[-1],
        "smallest_chunk_overhead_percent": 100 * (smallest - 1), "largest_chunk_overhead_percent": 100 * (largest - 1),
        "overhead_falls": float(smallest > largest),
        "paper_512_min_percent": 100 * (min(r[512] for r in paper.values()) - 1),
        "paper_512_max_percent": 100 * (max(r[512] for r in paper.values()) - 1),
    }
    facts = [
        (
            f"Chunks of {c:,}: time over the whole prefill",
            f"{result.mean_overhead(c):.2f}× (mean over the prompt lengths)",
        )
        for c in sizes
    ]
    facts += [
        (f"The paper, a {length:,}-token prompt: chunk size, time over the whole prefill", paper_row_text(length, row))
        for length, row in sorted(paper.items())
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
        "overhead_falls", "paper_512_min_percent", "paper_512_max_percent",
    ),
    figures={"overhead": _figure},
    run=_run,
    description=(
        "Prompts prefilled whole and in chunks: each chunk size's time over the whole prefill "
        "(Sarathi-Serve Figure 9a)."
    ),
    page_results=labelled_page_results("papers_chunk_cost", "result"),
)
