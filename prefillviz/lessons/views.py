"""Showing a step's run: its figure, and the results and widget values that make the step's full
view (the app page in ``Step.view``) show that same run.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from prefillviz.lessons.actions import ActionOutcome
from prefillviz.lessons.registry import ACTION_KINDS
from prefillviz.lessons.reveal_text import after_reveal_text
from prefillviz.lessons.spec import Step


def page_results(outcome: ActionOutcome, label: str) -> dict[str, Any]:
    """``save_result`` keys and values that make the step's full view show this same run.

    Args:
        outcome: the step's run.
        label: how the chunked and prefix pages caption their times (``run_label``).
    """
    return ACTION_KINDS[outcome.kind].page_results(outcome, label)


def page_state(outcome: ActionOutcome) -> dict[str, str]:
    """Other pages' widget values a step sets: the Prefill page's prompt (and preset) after a prefill."""
    if outcome.prompt is None:
        return {}
    state = {"prefill_prompt": outcome.prompt}
    if outcome.preset is not None:
        state["prefill_preset"] = outcome.preset
    return state


def step_figure(step: Step, outcome: ActionOutcome) -> go.Figure:
    """The step's figure, drawn from its run."""
    return ACTION_KINDS[outcome.kind].figures[step.figure](outcome)


def step_after_reveal(step: Step, outcome: ActionOutcome) -> str:
    """The step's after-reveal text for this run: measured numbers filled in, the variant its outcome picks."""
    return after_reveal_text(step.after_reveal, ACTION_KINDS[outcome.kind], outcome)
