"""Loading lesson files: ``NN_slug.md`` (title, intro, one "## " section per step) and
``NN_slug.json`` (one step spec per section), checked against the action kinds when loaded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prefillviz.lessons.actions import ActionKind, check_parameters
from prefillviz.lessons.glossary import GLOSSARY_FILE
from prefillviz.lessons.registry import ACTION_KINDS
from prefillviz.lessons.reveal_text import parse_after_reveal
from prefillviz.lessons.spec import (
    AFTER_REVEAL,
    LESSONS_DIR,
    MAX_MINUTES,
    ROOT,
    SETTINGS,
    Choice,
    Lesson,
    LessonError,
    Question,
    Step,
    _number,
    _require,
)


def parse_markdown(text: str, where: str) -> tuple[str, str, list[tuple[str, str, str]]]:
    """Split a lesson's markdown into (title, intro, [(step title, narration, after the reveal)]).

    Raises:
        LessonError: no "# " title on the first line, no "## " step, or a step without narration.
    """
    lines = text.strip().splitlines()
    if not lines or not lines[0].startswith("# "):
        raise LessonError(f"{where}: the first line must be the lesson title, starting with '# '.")
    title = lines[0][2:].strip()
    body = "\n".join(lines[1:])
    parts = re.split(r"^## +(.+)$", body, flags=re.MULTILINE)  # intro, title 1, text 1, title 2, ...
    intro, sections = parts[0].strip(), []
    for step_title, step_text in zip(parts[1::2], parts[2::2]):
        narration, _, after = step_text.partition(AFTER_REVEAL)
        if not narration.strip():
            raise LessonError(f"{where}: step '{step_title.strip()}' has no narration under its '## ' heading.")
        sections.append((step_title.strip(), narration.strip(), after.strip()))
    if not sections:
        raise LessonError(f"{where}: no steps; each step starts with a '## ' heading.")
    return title, intro, sections


def parse_question(spec: Any, kind: ActionKind, where: str) -> Question:
    _require(isinstance(spec, dict), where, "'question' must be an object.")
    known = {"kind", "text", "answer", "unit", "options", "default", "compare", "close_within"}
    _require(
        not set(spec) - known, where, f"unknown question field(s) {sorted(set(spec) - known)} (known: {sorted(known)})."
    )
    question_kind, text, answer = spec.get("kind"), spec.get("text"), spec.get("answer")
    _require(
        question_kind in ("number", "choice"), where,
        f"question kind must be 'number' or 'choice', got {question_kind!r}.",
    )
    _require(isinstance(text, str) and text.strip() != "", where, "the question needs a 'text'.")
    _require(
        answer in kind.measured, where,
        f"the question's answer {answer!r} is not measured by action kind {kind.name!r} "
        f"(it measures: {', '.join(kind.measured)}).",
    )
    options = spec.get("options")
    unit = spec.get("unit", "")
    _require(isinstance(unit, str), where, "'unit' must be text.")
    if question_kind == "number":
        _require(
            isinstance(options, list) and len(options) >= 3 and all(map(_number, options)),
            where, "a number question needs 'options': a list of at least 3 numbers (the slider's stops).",
        )
        _require(all(a < b for a, b in zip(options, options[1:])), where, "the slider's 'options' must increase.")
        default = spec.get("default", options[len(options) // 2])
        _require(default in options, where, f"the 'default' {default!r} is not one of the slider's options.")
        compare = spec.get("compare", "ratio")
        _require(
            compare in ("ratio", "difference"), where, f"'compare' must be 'ratio' or 'difference', got {compare!r}."
        )
        _require(compare == "difference" or options[0] > 0, where, "a 'ratio' comparison needs options above 0.")
        close_within = spec.get("close_within", 1.5 if compare == "ratio" else (options[-1] - options[0]) / 10)
        _require(_number(close_within) and close_within > 0, where, "'close_within' must be a positive number.")
        return Question("number", text.strip(), answer, unit, tuple(options), default, (), compare, float(close_within))
    _require(isinstance(options, list) and len(options) >= 2, where, "a choice question needs at least 2 'options'.")
    choices = []
    for i, option in enumerate(options):
        _require(
            isinstance(option, dict) and isinstance(option.get("label"), str), where, f"choice {i + 1} needs a 'label'."
        )
        _require(not set(option) - {"label", "up_to"}, where, f"choice {i + 1} may only have 'label' and 'up_to'.")
        last = i == len(options) - 1
        up_to = option.get("up_to")
        _require(
            (up_to is None) if last else _number(up_to), where,
            "every choice but the last needs a number 'up_to' (the measured value falls in the first choice "
            "it does not exceed); the last choice takes the rest and has none.",
        )
        choices.append(Choice(option["label"], None if last else float(up_to)))
    bounds = [c.up_to for c in choices[:-1]]
    _require(all(a < b for a, b in zip(bounds, bounds[1:])), where, "the choices' 'up_to' values must increase.")
    _require("default" not in spec, where, "a choice question has no default: nothing is picked until the user picks.")
    return Question("choice", text.strip(), answer, unit, (), None, tuple(choices))


def parse_step(spec: Any, index: int, section: tuple[str, str, str], where: str) -> Step:
    where = f"{where}: step {index + 1} ('{section[0]}')"
    _require(isinstance(spec, dict), where, "a step spec must be an object.")
    known = {"action", "view", "question", "figure", "settings"}
    _require(not set(spec) - known, where, f"unknown field(s) {sorted(set(spec) - known)} (known: {sorted(known)}).")
    action = spec.get("action")
    _require(isinstance(action, dict) and "kind" in action, where, "the step needs an 'action' with a 'kind'.")
    kind = ACTION_KINDS.get(action["kind"])
    _require(kind is not None, where, f"unknown action kind {action['kind']!r} (known: {', '.join(ACTION_KINDS)}).")
    check_parameters(kind, action, where)
    view = spec.get("view")
    _require(
        isinstance(view, str) and view.startswith("views/") and (ROOT / view).is_file(), where,
        f"'view' must name a page file under views/ (got {view!r}).",
    )
    figure = spec.get("figure", next(iter(kind.figures)))
    _require(
        figure in kind.figures, where,
        f"figure {figure!r} is not one that {kind.name!r} draws ({', '.join(kind.figures)}).",
    )
    settings = spec.get("settings", {})
    _require(isinstance(settings, dict), where, "'settings' must be an object.")
    for name, value in settings.items():
        _require(name in SETTINGS, where, f"unknown setting {name!r} (known: {', '.join(SETTINGS)}).")
        _require(
            value in SETTINGS[name][1], where,
            f"setting {name} must be one of {', '.join(SETTINGS[name][1])}, got {value!r}.",
        )
    question = parse_question(spec.get("question"), kind, where)
    parse_after_reveal(section[2], kind, where)  # its placeholders and variants name what the kind measures
    return Step(index, section[0], section[1], section[2], dict(action), view, question, figure, dict(settings))


def load_lesson(markdown_path: Path) -> Lesson:
    """One lesson from ``NN_slug.md`` and its ``NN_slug.json``.

    Raises:
        LessonError: a missing or malformed file, or a spec that does not fit the markdown.
    """
    markdown_path = Path(markdown_path)
    spec_path = markdown_path.with_suffix(".json")
    where = spec_path.name
    match = re.match(r"(\d+)_[a-z0-9_]+$", markdown_path.stem)
    _require(match is not None, markdown_path.name, "lesson files are named NN_slug.md / NN_slug.json (lower case).")
    _require(spec_path.is_file(), markdown_path.name, f"its step spec {spec_path.name} is missing.")
    title, intro, sections = parse_markdown(markdown_path.read_text(encoding="utf-8"), markdown_path.name)
    try:
        spec = json.loads(spec_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise LessonError(f"{where}: not valid JSON ({error}).") from None
    _require(isinstance(spec, dict), where, "the spec must be an object with 'minutes' and 'steps'.")
    _require(
        not set(spec) - {"minutes", "steps"}, where, f"unknown field(s) {sorted(set(spec) - {'minutes', 'steps'})}."
    )
    minutes = spec.get("minutes")
    _require(
        isinstance(minutes, int) and 1 <= minutes <= MAX_MINUTES, where,
        f"'minutes' (the estimated time to complete) must be a whole number from 1 to {MAX_MINUTES}, got {minutes!r}.",
    )
    steps = spec.get("steps")
    _require(isinstance(steps, list) and len(steps) > 0, where, "'steps' must be a non-empty list.")
    _require(
        len(steps) == len(sections), where,
        f"{len(steps)} step spec(s) but {markdown_path.name} has {len(sections)} '## ' step section(s); "
        "they must match one to one.",
    )
    parsed = tuple(parse_step(step, i, section, where) for i, (step, section) in enumerate(zip(steps, sections)))
    return Lesson(markdown_path.stem, int(match.group(1)), title, intro, minutes, parsed)


def load_lessons(folder: Path | str = LESSONS_DIR) -> list[Lesson]:
    """Every lesson in ``folder``, in file-name order.

    Raises:
        LessonError: no lessons, a spec without its markdown, or any lesson that fails to load.
    """
    folder = Path(folder)
    markdown = sorted(p for p in folder.glob("*.md") if p.name != GLOSSARY_FILE)  # the glossary is no lesson
    orphans = sorted({p.stem for p in folder.glob("*.json")} - {p.stem for p in markdown})
    _require(
        not orphans, str(folder), f"step spec(s) without a lesson text: {', '.join(o + '.json' for o in orphans)}."
    )
    _require(bool(markdown), str(folder), "no lessons (NN_slug.md + NN_slug.json) found.")
    return [load_lesson(path) for path in markdown]
