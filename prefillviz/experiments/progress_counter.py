"""One progress fraction over an experiment made of several runs.

Each unit of work (a one-step run, or one step of a longer run) moves the fraction by
``1 / total_units``; ``per_step`` hands a run a ``StepProgress`` that counts its steps.
"""

from __future__ import annotations

from collections.abc import Callable

from prefillviz.progress import FractionProgress, StepProgress


class ProgressCounter:
    """Counts work units done and reports ``(fraction done, text)`` to a ``FractionProgress``."""

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
