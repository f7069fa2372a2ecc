"""The text shown after the reveal, written from the run: placeholders filled with measured numbers,
and variants chosen by what was measured, so the explanation never contradicts the measurement.

A step's "### After the reveal" section is shared text, then optional groups of variants:

    The forward pass is {forward_share_percent}% of TTFT on {device} in {dtype}.   <- shared text

    #### If ttft_ratio < 2                  <- the first variant of a group whose condition holds is shown
    TTFT hardly grew: ...
    #### If ttft_over_flop_ratio < 0.8 and on_gpu < 1
    ...
    #### Otherwise                          <- ends a group: the rest of the outcomes
    ...
    #### If placement_kind < 1              <- after an "Otherwise", a new group: one of its variants is
    ...                                         shown too, below the first group's
    #### Otherwise
    ...

``{name}`` is a measured number of the step's action kind (``ActionKind.measured``), written by
``format_value``; ``{device}``, ``{dtype}`` and ``{model_id}`` say what ran. A condition is
``name op number`` (op one of < <= > >=), or several joined by "and"; besides the measured names it
may name what ran as a number (``RUN_NUMBERS``: ``on_gpu``, ``dtype_bytes``).
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
RUN_NUMBERS = ("on_gpu", "dtype_bytes")  # what ran, as numbers a condition may name
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
VARIANT = re.compile(r"^#### +(.+)$", flags=re.MULTILINE)
TEST = re.compile(r"^([a-z_][a-z0-9_]*) *(<=|>=|<|>) *(-?[\d.]+(?:e-?\d+)?)$")


@dataclass(frozen=True)
class Condition:
    """``name op bound``: one test of a measured number (or a run number)."""

    name: str
    op: str
    bound: float

    def holds(self, numbers: dict[str, float]) -> bool:
        return OPERATORS[self.op](numbers[self.name], self.bound)


def parse_condition(text: str, names: tuple[str, ...], where: str) -> tuple[Condition, ...]:
    """``"a < 1 and b >= 2"`` -> its conditions, each checked to name one of ``names`` or a run number.

    Raises:
        LessonError: a malformed test, or a name neither measured nor a run number.
    """
    conditions = []
    for part in re.split(r" +and +", text.strip()):
        match = TEST.match(part.strip())
        _require(
            match is not None, where,
            f"variant heading {'If ' + text!r} must read 'If name < number' (or <=, >, >=; several joined by "
            "'and') or 'Otherwise'.",
        )
        name, op, bound = match.groups()
        _require(
            name in names or name in RUN_NUMBERS, where,
            f"variant condition names {name!r}, which is neither measured nor one of {', '.join(RUN_NUMBERS)}.",
        )
        conditions.append(Condition(name, op, float(bound)))
    return tuple(conditions)


@dataclass(frozen=True)
class Variant:
    """One "#### If ..." block (``conditions`` empty: the "#### Otherwise" block that ends its group).

    ``name``, ``op`` and ``bound`` are the first condition's (None, "", 0 for "Otherwise")."""

    conditions: tuple[Condition, ...]
    text: str
    group: int = 0

    @property
    def name(self) -> str | None:
        return self.conditions[0].name if self.conditions else None

    @property
    def op(self) -> str:
        return self.conditions[0].op if self.conditions else ""

    @property
    def bound(self) -> float:
        return self.conditions[0].bound if self.conditions else 0.0

    def holds(self, numbers: dict[str, float]) -> bool:
        return all(condition.holds(numbers) for condition in self.conditions)


def parse_after_reveal(text: str, kind: ActionKind, where: str) -> tuple[str, tuple[Variant, ...]]:
    """Split an after-reveal section into its shared text and its variants, checked against ``kind``.

    Raises:
        LessonError: an unknown name (placeholder or condition), a malformed condition, or a group of
            variants that does not end with "#### Otherwise".
    """
    parts = VARIANT.split(text)
    shared, variants, group = parts[0].strip(), [], 0
    for heading, body in zip(parts[1::2], parts[2::2]):
        heading = heading.strip()
        if heading == "Otherwise":
            _require(
                bool(variants) and variants[-1].group == group and variants[-1].conditions, where,
                "'#### Otherwise' must be the last variant of a group that starts with '#### If'.",
            )
            variants.append(Variant((), body.strip(), group))
            group += 1
            continue
        _require(heading.startswith("If "), where, f"variant heading {heading!r} must read 'If name < number' "
                 "(or <=, >, >=) or 'Otherwise'.")
        variants.append(Variant(parse_condition(heading[3:], kind.measured, where), body.strip(), group))
    _require(
        not variants or not variants[-1].conditions, where,
        "the last variant must be '#### Otherwise', so every outcome has a text.",
    )
    for piece in [shared] + [v.text for v in variants]:
        for name in PLACEHOLDER.findall(piece):
            _require(
                name in kind.measured or name in RUN_WORDS, where,
                f"placeholder {{{name}}} is not measured by {kind.name!r}.",
            )
    return shared, tuple(variants)


def run_numbers(outcome: ActionOutcome) -> dict[str, float]:
    """What ran, as numbers: ``on_gpu`` (1 on any accelerator, 0 on the CPU) and ``dtype_bytes``."""
    return {"on_gpu": float(not outcome.device.startswith("cpu")), "dtype_bytes": float(DTYPE_BYTES[outcome.dtype])}


def fill(text: str, outcome: ActionOutcome) -> str:
    """Replace ``{name}`` with the run's measured number (or its device, dtype, model)."""
    run = {"device": outcome.device, "dtype": outcome.dtype, "model_id": outcome.model_id}

    def value(match: re.Match) -> str:
        name = match.group(1)
        return run[name] if name in run else format_value(outcome.measured[name])

    return PLACEHOLDER.sub(value, text)


def chosen_variants(variants: tuple[Variant, ...], numbers: dict[str, float]) -> list[Variant]:
    """The first variant of each group whose condition the numbers meet, in group order."""
    chosen: dict[int, Variant] = {}
    for variant in variants:
        if variant.group not in chosen and variant.holds(numbers):
            chosen[variant.group] = variant
    return [chosen[group] for group in sorted(chosen)]


def chosen_variant(variants: tuple[Variant, ...], numbers: dict[str, float]) -> Variant | None:
    """The first group's chosen variant (None: the step has no variants)."""
    return next(iter(chosen_variants(variants, numbers)), None)


def after_reveal_text(text: str, kind: ActionKind, outcome: ActionOutcome) -> str:
    """The after-reveal markdown for this run: shared text and the variant of each group its measurement picks."""
    shared, variants = parse_after_reveal(text, kind, "after the reveal")
    picked = chosen_variants(variants, outcome.measured | run_numbers(outcome))
    return "\n\n".join(fill(piece, outcome) for piece in [shared, *(v.text for v in picked)] if piece)
