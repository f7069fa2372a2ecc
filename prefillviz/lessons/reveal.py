"""The reveal: a prediction next to the measured answer (``format_reveal``), and how numbers read."""

from __future__ import annotations

import math
from dataclasses import dataclass

from prefillviz.lessons.spec import Question


@dataclass(frozen=True)
class Reveal:
    """The measured answer next to the prediction.

    Attributes:
        measured_text: the measured value (number questions) or the option it falls in (choice).
        prediction_text: what the user predicted.
        verdict: one sentence on how far off the prediction was.
        close: the prediction was right (choice) or within ``close_within`` (number).
        off_by: the factor (compare "ratio") or the difference (compare "difference"); None for choices.
    """

    measured_text: str
    prediction_text: str
    verdict: str
    close: bool
    off_by: float | None = None


def format_value(value: float, unit: str = "") -> str:
    """A measured or predicted number as a person reads it: 38.2×, 46,080 B, 7.4%, 0.049."""
    if not math.isfinite(value):
        return "n/a"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if not unit:
        return text
    return f"{text}{unit}" if unit in ("×", "%") else f"{text} {unit}"


def choice_for(question: Question, value: float) -> int:
    """Index of the choice a measured value falls in: the first whose ``up_to`` it does not exceed."""
    for i, choice in enumerate(question.choices):
        if choice.up_to is None or value <= choice.up_to:
            return i
    return len(question.choices) - 1


def format_reveal(question: Question, measured: float, prediction: float | int) -> Reveal:
    """Compare a prediction with the measured answer.

    Args:
        question: the step's question.
        measured: the measured value of ``question.answer``.
        prediction: a slider value (number question) or a choice index (choice question).
    """
    measured_text = format_value(measured, question.unit)
    if question.kind == "choice":
        right = choice_for(question, measured)
        picked = question.choices[int(prediction)].label
        answer = question.choices[right].label
        measured_text = f"{answer} (measured: {format_value(measured, question.unit)})"
        if int(prediction) == right:
            return Reveal(measured_text, picked, f"Right: the measurement falls in “{answer}”.", True)
        return Reveal(
            measured_text, picked, f"Not this time: you picked “{picked}”, the measurement falls in “{answer}”.", False
        )
    prediction = float(prediction)
    prediction_text = format_value(prediction, question.unit)
    if question.compare == "difference":
        off_by = prediction - measured
        close = abs(off_by) <= question.close_within
        if close:
            verdict = f"Close: within {format_value(abs(off_by), question.unit)} of the measurement."
        else:
            direction = "high" if off_by > 0 else "low"
            verdict = f"Off by {format_value(abs(off_by), question.unit)}: you guessed {direction}."
        return Reveal(measured_text, prediction_text, verdict, close, off_by)
    if measured <= 0:
        return Reveal(
            measured_text, prediction_text, "The measurement is not positive, so there is no factor to compare.", False
        )
    factor = max(prediction / measured, measured / prediction)
    close = factor <= question.close_within
    if factor < 1.05:
        verdict = "Spot on."
    elif close:
        verdict = f"Close: within a factor of {factor:.2f} of the measurement."
    else:
        direction = "high" if prediction > measured else "low"
        verdict = f"Off by a factor of {factor:,.1f}: you guessed {direction}."
    return Reveal(measured_text, prediction_text, verdict, close, factor)
