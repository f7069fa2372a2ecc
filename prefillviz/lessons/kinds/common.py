"""What every action kind's run shares: the outcome it returns, and the prompt a spec names."""

from __future__ import annotations

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


def prompt_of(parameters: dict) -> tuple[str, str | None]:
    """(prompt text, preset name or None): a spec's own ``prompt`` wins over its ``preset``."""
    if parameters.get("prompt"):
        return parameters["prompt"], None
    return PRESETS[parameters["preset"]], parameters["preset"]
