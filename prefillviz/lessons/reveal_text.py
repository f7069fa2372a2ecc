"""The text shown after the reveal, written from the run: placeholders filled with measured numbers,
and variants chosen by what was measured, so the explanation never contradicts the measurement.

A step's "### After the reveal" section is shared text, then optional variants:

    The forward pass is {forward_share_percent}% of TTFT on {device} in {dtype}.   <- shared text

    #### If ttft_ratio < 2                  <- the first variant whose condition holds is shown
    TTFT hardly grew: ...
    #### If ttft_over_flop_ratio < 0.8
    ...
    #### Otherwise                          <- required last: the rest of the outcomes
    ...

``{name}`` is a measured number of the step's action kind (``ActionKind.measured``), written by
``format_value``; ``{device}``, ``{dtype}`` and ``{model_id}`` say what ran. A condition is
``name op number`` with op one of < <= > >=.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.reveal import format_value
from prefillviz.lessons.spec import _require

OPERATORS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
RUN_WORDS = ("device", "dtype", "model_id")  # placeholders that say what ran
PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
VARIANT = re.compile(r"^#### +(.+)$", flags=re.MULTILINE)
CONDITION = re.compile(r"^If +([a-z_][a-z0-9_]*) *(<=|>=|<|>) *(-?[\d.]+(?:e-?\d+)?)$")


@dataclass(frozen=True)
class Variant:
    """One "#### If name op number" block (``name`` None: the "#### Otherwise" block)."""

    name: str | None
    op: str
    bound: float
    text: str

    def holds(self, measured: dict[str, float]) -> bool:
        return self.name is None or OPERATORS[self.op](measured[self.name], self.bound)


def parse_after_reveal(text: str, kind: ActionKind, where: str) -> tuple[str, tuple[Variant, ...]]:
    """Split an after-reveal section into its shared text and its variants, checked against ``kind``.

    Raises:
        LessonError: an unknown name (placeholder or condition), a malformed condition, or
            variants that do not end with "#### Otherwise".
    """
    parts = VARIANT.split(text)
    shared, variants = parts[0].strip(), []
    for heading, body in zip(parts[1::2], parts[2::2]):
        heading = heading.strip()
        if heading == "Otherwise":
            variants.append(Variant(None, "", 0.0, body.strip()))
            continue
        match = CONDITION.match(heading)
        _require(
            match is not None, where,
            f"variant heading {heading!r} must read 'If name < number' (or <=, >, >=) or 'Otherwise'.",
        )
        name, op, bound = match.groups()
        _require(
            name in kind.measured, where, f"variant condition names {name!r}, which {kind.name!r} does not measure."
        )
        variants.append(Variant(name, op, float(bound), body.strip()))
    if variants:
        _require(
            variants[-1].name is None, where, "the last variant must be '#### Otherwise', so every outcome has a text."
        )
        _require(all(v.name is not None for v in variants[:-1]), where, "'#### Otherwise' must be the last variant.")
    for piece in [shared] + [v.text for v in variants]:
        for name in PLACEHOLDER.findall(piece):
            _require(
                name in kind.measured or name in RUN_WORDS, where,
                f"placeholder {{{name}}} is not measured by {kind.name!r}.",
            )
    return shared, tuple(variants)


def fill(text: str, outcome: ActionOutcome) -> str:
    """Replace ``{name}`` with the run's measured number (or its device, dtype, model)."""
    run = {"device": outcome.device, "dtype": outcome.dtype, "model_id": outcome.model_id}

    def value(match: re.Match) -> str:
        name = match.group(1)
        return run[name] if name in run else format_value(outcome.measured[name])

    return PLACEHOLDER.sub(value, text)


def chosen_variant(variants: tuple[Variant, ...], measured: dict[str, float]) -> Variant | None:
    """The first variant whose condition the measurement meets (None: the step has no variants)."""
    return next((v for v in variants if v.holds(measured)), None)


def after_reveal_text(text: str, kind: ActionKind, outcome: ActionOutcome) -> str:
    """The after-reveal markdown for this run: shared text and the variant its measurement picks."""
    shared, variants = parse_after_reveal(text, kind, "after the reveal")
    variant = chosen_variant(variants, outcome.measured)
    pieces = [shared] + ([variant.text] if variant is not None else [])
    return "\n\n".join(fill(piece, outcome) for piece in pieces if piece)
