"""The lesson and step model: what a loaded lesson is (``Lesson``, ``Step``, ``Question``,
``Choice``), where lesson files live, the step settings a spec may apply, ``LessonError``, and
the small checks the loader and the action parameter check share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefillviz.engine.errors import PrefillVizError

ROOT = Path(__file__).resolve().parents[2]
LESSONS_DIR = ROOT / "assets" / "lessons"
MAX_MINUTES = 10  # every lesson must be completable in a class period's slice
AFTER_REVEAL = "### After the reveal"
# step setting -> (sidebar key, allowed)
SETTINGS = {"dtype": ("sidebar_dtype", ("auto", "float32", "bfloat16", "float16"))}


class LessonError(PrefillVizError):
    """A lesson file is missing, malformed, or asks for something no action measures."""


@dataclass(frozen=True)
class Choice:
    label: str
    up_to: float | None  # the measured value falls here if <= up_to (None: the rest)


@dataclass(frozen=True)
class Question:
    """A "predict, then reveal" question; ``answer`` names the measured number that answers it.

    Attributes:
        kind: "number" (a slider over ``options``) or "choice" (radio buttons over ``choices``).
        compare: how far a number prediction is off: "ratio" (factor) or "difference" (in ``unit``).
        close_within: a prediction this close counts as close (factor for "ratio", ``unit`` for "difference").
    """

    kind: str
    text: str
    answer: str
    unit: str = ""
    options: tuple[float, ...] = ()
    default: float | None = None
    choices: tuple[Choice, ...] = ()
    compare: str = "ratio"
    close_within: float = 1.5


@dataclass(frozen=True)
class Step:
    index: int  # 0-based
    title: str
    narration: str  # markdown
    after_reveal: str  # markdown shown once the answer is revealed ("" if none)
    action: dict  # {"kind": ..., parameters}
    view: str  # the app page that shows this kind of run in full
    question: Question
    figure: str  # a name in ACTION_KINDS[kind].figures
    settings: dict  # {"dtype": "float32"}: sidebar settings the step applies before it runs


@dataclass(frozen=True)
class Lesson:
    slug: str  # file stem, e.g. "01_prefill_and_ttft"
    number: int
    title: str
    intro: str
    minutes: int  # estimated time to complete, reading and runs included
    steps: tuple[Step, ...]

    @property
    def num_steps(self) -> int:
        return len(self.steps)


def _require(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise LessonError(f"{where}: {message}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
