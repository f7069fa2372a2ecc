"""The ``papers_piggyback`` action: a decode-only step, a prefill chunk alone, and the chunk with 3
decodes riding along (Sarathi-Serve, Table 2), timed; time per token in each."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.experiments import papers_published as published
from prefillviz.experiments.papers_piggyback import run_piggyback
from prefillviz.figures import papers as figures
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import labelled_page_results, papers_outcome
from prefillviz.machine.progress import FractionProgress


def _run(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    result = run_piggyback(loaded, parameters["chunk_tokens"], parameters["runs"], report)
    measured = {
        "chunk_tokens": result.chunk_tokens,
        "decode_only_per_token_ms": result.decode_only_per_token_ms,
        "prefill_per_token_ms": result.prefill_alone_per_token_ms,
        "mixed_per_token_ms": result.mixed_per_token_ms,
        "piggyback_ratio": result.ratio,
        "paper_ratio": published.piggyback_ratio(),
        "mixed_over_prefill": result.mixed_over_prefill,
    }
    facts = [
        (
            "Decode-only step of 4 users",
            f"{result.decode_only_ms:,.1f} ms: {result.decode_only_per_token_ms:,.2f} ms per token",
        ),
        (
            f"A prefill chunk of {result.chunk_tokens:,} tokens alone",
            f"{result.prefill_alone_ms:,.1f} ms: {result.prefill_alone_per_token_ms:,.3f} ms per token",
        ),
        (
            f"{result.chunk_tokens - 3:,} prefill tokens + 3 decodes",
            f"{result.mixed_ms:,.1f} ms: {result.mixed_per_token_ms:,.3f} ms per token",
        ),
        (
            "A decode token: decode-only step over riding along",
            f"{result.ratio:,.1f}× (the paper: {published.piggyback_ratio():,.1f}×)",
        ),
    ]
    return papers_outcome("papers_piggyback", loaded, parameters, measured, facts, result, "piggyback")


def _figure(outcome: ActionOutcome) -> go.Figure:
    return figures.piggyback_figure(
        outcome.raw["papers_piggyback"], "Time per token in each kind of step, over the prefill chunk's"
    )


KIND = ActionKind(
    name="papers_piggyback",
    parameters={"chunk_tokens": (int, 512), "runs": (int, 3)},
    scaled={"chunk_tokens": 16},
    measured=(
        "chunk_tokens", "decode_only_per_token_ms", "prefill_per_token_ms", "mixed_per_token_ms", "piggyback_ratio",
        "paper_ratio", "mixed_over_prefill",
    ),
    figures={"per_token": _figure},
    run=_run,
    description=(
        "A decode-only step, a prefill chunk alone, and the chunk with 3 decodes riding along, timed "
        "(Sarathi-Serve Table 2)."
    ),
    page_results=labelled_page_results("papers_piggyback", "result"),
)
