"""The controls of the Chunked prefill page's workload (a few users decoding, a long prompt
arriving), shared by every page that runs it: the same sliders, defaults and limits, each
page's widgets under its own key prefix."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from prefillviz.experiments.chunked import WORKLOAD_DEFAULTS as DEFAULTS


@dataclass(frozen=True)
class WorkloadChoice:
    num_short: int
    short_tokens: int
    short_new: int
    long_tokens: int
    arrival: int
    budget: int


def workload_controls(prefix: str, arrival_help: str | None = None, budget_help: str | None = None) -> WorkloadChoice:
    """Two rows of sliders (``<prefix>_num_short``, ``<prefix>_short_prompt_tokens``, ...); the user's choice."""
    row = st.columns(3)
    num_short = row[0].slider("Short requests already decoding", 1, 6, DEFAULTS.num_short_requests,
                              key=f"{prefix}_num_short")
    short_tokens = row[1].slider("Their prompt length (tokens)", 4, 64, DEFAULTS.short_prompt_tokens,
                                 key=f"{prefix}_short_prompt_tokens")
    short_new = row[2].slider("Their new tokens (each)", 2, 64, DEFAULTS.short_max_new_tokens,
                              key=f"{prefix}_short_new_tokens")
    row = st.columns(3)
    long_tokens = row[0].slider("Long prompt length (tokens)", 64, 2048, DEFAULTS.long_prompt_tokens, step=64,
                                key=f"{prefix}_long_prompt_tokens")
    arrival = row[1].slider("The long prompt arrives at step", 0, 16, DEFAULTS.arrival_step,
                            key=f"{prefix}_arrival_step", help=arrival_help)
    budget = row[2].number_input("Token budget per step", value=DEFAULTS.token_budget, step=16,
                                 key=f"{prefix}_token_budget", help=budget_help)
    return WorkloadChoice(num_short, short_tokens, short_new, long_tokens, arrival, int(budget))
