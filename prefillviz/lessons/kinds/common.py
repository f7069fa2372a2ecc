"""What every action kind's run shares: the outcome it returns (a papers kind's, citing its paper), the
facts and page results several kinds repeat, and the prompt a spec names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefillviz.experiments import papers_published as published
from prefillviz.lessons.actions import ActionOutcome
from prefillviz.loading.prompts import PRESETS
from prefillviz.machine.devices import dtype_name

PROMPT_PARAMETERS = {"preset": (str, "Chat with a system prompt"), "prompt": (str, None)}  # a spec's "prompt" wins


def make_outcome(kind: str, loaded, parameters: dict, measured: dict, facts: list, raw: dict, **extra) -> ActionOutcome:
    return ActionOutcome(
        kind=kind,
        parameters=parameters,
        measured={name: float(value) for name, value in measured.items()},
        facts=facts,
        raw=raw,
        model_id=loaded.model_id,
        device=str(loaded.device),
        dtype=dtype_name(loaded.dtype),
        **extra,
    )


def papers_outcome(
    kind: str, loaded, parameters: dict, measured: dict, facts: list, result, source: str, source_label: str = "Source"
) -> ActionOutcome:
    """A papers kind's outcome: its facts end with the paper it compares with (``published.SOURCES[source]``),
    and its one result is kept under the kind's own name, where its figures and its page read it."""
    cited = [*facts, (source_label, published.SOURCES[source].citation)]
    return make_outcome(kind, loaded, parameters, measured, cited, {kind: result})


def outputs_fact(measured: dict) -> tuple[str, str]:
    """The last fact of a kind that runs the same requests two ways: whether both generated the same tokens."""
    return ("Same tokens generated", "yes" if measured["outputs_identical"] else "no")


def labelled_page_results(kind: str, field: str) -> Callable[[ActionOutcome, str], dict[str, Any]]:
    """``ActionKind.page_results`` for a kind whose page shows the run's ``raw[kind]`` as ``field``,
    captioned with the run's label."""
    return lambda run, label: {kind: {field: run.raw[kind], "label": label}}


def prompt_of(parameters: dict) -> tuple[str, str | None]:
    """(prompt text, preset name or None): a spec's own ``prompt`` wins over its ``preset``."""
    if parameters.get("prompt"):
        return parameters["prompt"], None
    return PRESETS[parameters["preset"]], parameters["preset"]
