"""The progress callbacks that long runs report through, each signature named once.

The app turns each into a progress bar (``ui.shell``); the command line prints or ignores them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from prefillviz.instrument.trace import StepRecord

FractionProgress = Callable[[float, str], None]
"""(fraction done 0..1, what is running): experiments made of several runs."""

StepProgress = Callable[[int, "StepRecord"], None]
"""(steps done in this run, the step's record): ``LLMEngine.run``'s callback, one call a step."""

MessageProgress = Callable[[str], None]
"""A short message per phase: model loading."""


def offset_progress(progress: StepProgress | None, offset: int) -> StepProgress | None:
    """``progress`` counting on from ``offset``: one bar across several ``LLMEngine.run`` calls."""
    if progress is None:
        return None
    return lambda steps_done, record: progress(offset + steps_done, record)
