"""What a step action is: ``ActionKind`` (its parameters, what it measures, its figures, its
run), ``ActionOutcome`` (what one run measured), and the check of a spec's parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from prefillviz.experiments import prefix
from prefillviz.lessons.spec import _require
from prefillviz.loading.prompts import PRESETS


@dataclass
class ActionOutcome:
    """What one action measured on the model.

    Attributes:
        kind: the action kind.
        parameters: the parameters it ran with (defaults filled in, scale applied).
        measured: measured numbers by name (``ActionKind.measured``).
        facts: (label, formatted value) pairs shown next to the answer.
        raw: the experiment results the figures and the full views are drawn from.
        model_id, device, dtype: what ran.
        elapsed_s: wall time of the whole action.
        prompt, preset: the prompt text (and preset name) of a prefill, for the Prefill page.
    """

    kind: str
    parameters: dict
    measured: dict[str, float]
    facts: list[tuple[str, str]]
    raw: dict[str, Any]
    model_id: str
    device: str
    dtype: str
    elapsed_s: float = 0.0
    prompt: str | None = None
    preset: str | None = None


@dataclass(frozen=True)
class ActionKind:
    """One kind of step action.

    Attributes:
        name: the ``"kind"`` in a step spec.
        parameters: name -> (type, default) of every parameter a spec may give; a None
            default means "not set" (e.g. ``prompt``: the preset is used instead).
        scaled: token-count parameters ``scale`` multiplies, with the smallest value allowed.
        measured: the names of the numbers a run returns.
        figures: figure name -> builder(outcome); the first is the default.
        run: (loaded model, parameters, progress, scale) -> ActionOutcome.
        description: one line for readers of lesson specs.
        page_results: (outcome, run label) -> the ``save_result`` keys and values that make the
            step's full view (its app page) show this same run; none for a kind without a page.
    """

    name: str
    parameters: dict[str, tuple[type, Any]]
    scaled: dict[str, int]
    measured: tuple[str, ...]
    figures: dict[str, Callable[[ActionOutcome], go.Figure]]
    run: Callable[..., ActionOutcome]
    description: str
    page_results: Callable[[ActionOutcome, str], dict[str, Any]] = lambda run, label: {}


def _valid(kind_of: type, value: Any) -> bool:
    if kind_of is str:
        return isinstance(value, str) and value.strip() != ""
    if kind_of is int:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if kind_of is list:
        return isinstance(value, list) and len(value) > 0 and all(_valid(int, v) for v in value)
    return isinstance(value, kind_of)


def check_parameters(kind: ActionKind, action: dict, where: str) -> None:
    """Raise ``LessonError`` for unknown parameters, wrong types, or an unknown preset."""
    unknown = set(action) - {"kind"} - set(kind.parameters)
    _require(
        not unknown, where,
        f"action {kind.name!r} has no parameter(s) {sorted(unknown)} (it takes: {', '.join(kind.parameters)}).",
    )
    for name, value in action.items():
        if name != "kind":
            kind_of = kind.parameters[name][0]
            _require(
                _valid(kind_of, value), where,
                f"action {kind.name!r}: {name!r} must be {TYPE_WORDS[kind_of]}, got {value!r}.",
            )
    if "preset" in action:
        _require(
            action["preset"] in PRESETS, where, f"unknown preset {action['preset']!r} (known: {', '.join(PRESETS)})."
        )
    if "shared_prefix" in action:
        names = prefix.SHARED_PREFIXES
        _require(
            action["shared_prefix"] in names, where,
            f"unknown shared prefix {action['shared_prefix']!r} (known: {', '.join(names)}).",
        )


TYPE_WORDS = {
    str: "non-empty text", int: "a whole number >= 1", list: "a non-empty list of whole numbers >= 1",
    bool: "true or false",
}
