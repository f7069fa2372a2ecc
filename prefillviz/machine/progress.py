"""The progress callbacks that long runs report through, each signature named once.

The app turns each into a progress bar (``ui.running``); the command line prints or ignores them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefillviz.engine.trace import StepRecord

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


class ProgressCounter:
    """One fraction over an experiment made of several runs: counts work units done (a one-step
    run, or one step of a longer run) and reports ``(fraction done, text)`` to a ``FractionProgress``."""

    def __init__(self, progress: FractionProgress | None, total_units: int):
        self.progress = progress
        self.total_units = total_units
        self.num_done = 0

    def advance(self, text: str, units: int = 1) -> None:
        """``units`` more done (0: only say what is running now)."""
        self.num_done += units
        if self.progress is not None:
            self.progress(min(1.0, self.num_done / self.total_units), text)

    def per_step(self, describe: Callable[[int], str]) -> StepProgress | None:
        """A run's step callback: each step is one unit, described by ``describe(steps done in the run)``."""
        if self.progress is None:
            return None
        return lambda steps_done, _record: self.advance(describe(steps_done))
