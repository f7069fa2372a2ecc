"""Guided lessons: lesson files, checked when loaded, and the real model runs behind their steps.

A lesson is two files with the same stem under ``assets/lessons/``:

    01_prefill_and_ttft.md      # Title            <- the lesson's title
                                # intro text
                                # ## Step title    <- one section per step: the narration
                                # ### After the reveal   (optional: shown after the reveal)
    01_prefill_and_ttft.json    {"minutes": 7, "steps": [one spec per "## " section, in order]}

A step spec says what the step does to the app and asks:

    {"action":   {"kind": "prefill", "preset": "Short question"},   # what runs on the model
     "view":     "app_pages/prefill.py",                            # the full view of that run
     "figure":   "ttft_breakdown",                                  # optional: which figure
     "settings": {"dtype": "float32"},                              # optional: sidebar settings
     "question": {"kind": "number", "text": "...", "answer": "ttft_ratio",
                  "options": [1, 2, 4, 8, 16], "default": 4, "unit": "×"}}

Every action runs the real model through the experiments the pages use (``experiments.prefill``,
``parallel``, ``chunked``, ``prefix``; ``analysis.memory``) and returns **measured numbers by
name**; a question names the number that answers it (``ACTION_KINDS[kind].measured``). A
"choice" question sorts the measured number into the first option whose ``up_to`` it does not
exceed (the last option takes the rest). Nothing is hard-coded: the reveal shows what this run
measured. This module does not import streamlit; ``app_pages/walkthrough.py`` draws it.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import plotly.graph_objects as go

from prefillviz.analysis.memory import kv_memory_report
from prefillviz.config import EngineConfig
from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.request import SamplingParams
from prefillviz.errors import PrefillVizError
from prefillviz.experiments import chunked, inspect_run, parallel, prefix
from prefillviz.experiments.prefill import run_prefill
from prefillviz.figures import chunked as chunked_figures
from prefillviz.figures import kv_cache as kv_figures
from prefillviz.figures import parallel as parallel_figures
from prefillviz.figures import prefill as prefill_figures
from prefillviz.figures import prefix as prefix_figures
from prefillviz.figures import style
from prefillviz.prompts import PRESETS, bench_token_ids

ROOT = Path(__file__).resolve().parents[1]
LESSONS_DIR = ROOT / "assets" / "lessons"
MAX_MINUTES = 10  # every lesson must be completable in a class period's slice
AFTER_REVEAL = "### After the reveal"
SETTINGS = {"dtype": ("sidebar_dtype", ("auto", "float32", "bfloat16", "float16"))}  # step setting -> (sidebar key, allowed)

Progress = Callable[[float, str], None]  # (fraction done 0..1, what is running)


class LessonError(PrefillVizError):
    """A lesson file is missing, malformed, or asks for something no action measures."""


# ---------------------------------------------------------------- the lesson files
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


def _require(condition: bool, where: str, message: str) -> None:
    if not condition:
        raise LessonError(f"{where}: {message}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_question(spec: Any, kind: "ActionKind", where: str) -> Question:
    _require(isinstance(spec, dict), where, "'question' must be an object.")
    known = {"kind", "text", "answer", "unit", "options", "default", "compare", "close_within"}
    _require(not set(spec) - known, where, f"unknown question field(s) {sorted(set(spec) - known)} (known: {sorted(known)}).")
    question_kind, text, answer = spec.get("kind"), spec.get("text"), spec.get("answer")
    _require(question_kind in ("number", "choice"), where, f"question kind must be 'number' or 'choice', got {question_kind!r}.")
    _require(isinstance(text, str) and text.strip() != "", where, "the question needs a 'text'.")
    _require(
        answer in kind.measured, where,
        f"the question's answer {answer!r} is not measured by action kind {kind.name!r} (it measures: {', '.join(kind.measured)}).",
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
        _require(compare in ("ratio", "difference"), where, f"'compare' must be 'ratio' or 'difference', got {compare!r}.")
        _require(compare == "difference" or options[0] > 0, where, "a 'ratio' comparison needs options above 0.")
        close_within = spec.get("close_within", 1.5 if compare == "ratio" else (options[-1] - options[0]) / 10)
        _require(_number(close_within) and close_within > 0, where, "'close_within' must be a positive number.")
        return Question("number", text.strip(), answer, unit, tuple(options), default, (), compare, float(close_within))
    _require(isinstance(options, list) and len(options) >= 2, where, "a choice question needs at least 2 'options'.")
    choices = []
    for i, option in enumerate(options):
        _require(isinstance(option, dict) and isinstance(option.get("label"), str), where, f"choice {i + 1} needs a 'label'.")
        _require(not set(option) - {"label", "up_to"}, where, f"choice {i + 1} may only have 'label' and 'up_to'.")
        last = i == len(options) - 1
        up_to = option.get("up_to")
        _require(
            (up_to is None) if last else _number(up_to), where,
            "every choice but the last needs a number 'up_to' (the measured value falls in the first choice it does not "
            "exceed); the last choice takes the rest and has none.",
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
        isinstance(view, str) and view.startswith("app_pages/") and (ROOT / view).is_file(), where,
        f"'view' must name a page file under app_pages/ (got {view!r}).",
    )
    figure = spec.get("figure", next(iter(kind.figures)))
    _require(figure in kind.figures, where, f"figure {figure!r} is not one that {kind.name!r} draws ({', '.join(kind.figures)}).")
    settings = spec.get("settings", {})
    _require(isinstance(settings, dict), where, "'settings' must be an object.")
    for name, value in settings.items():
        _require(name in SETTINGS, where, f"unknown setting {name!r} (known: {', '.join(SETTINGS)}).")
        _require(value in SETTINGS[name][1], where, f"setting {name} must be one of {', '.join(SETTINGS[name][1])}, got {value!r}.")
    question = parse_question(spec.get("question"), kind, where)
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
    _require(not set(spec) - {"minutes", "steps"}, where, f"unknown field(s) {sorted(set(spec) - {'minutes', 'steps'})}.")
    minutes = spec.get("minutes")
    _require(
        isinstance(minutes, int) and 1 <= minutes <= MAX_MINUTES, where,
        f"'minutes' (the estimated time to complete) must be a whole number from 1 to {MAX_MINUTES}, got {minutes!r}.",
    )
    steps = spec.get("steps")
    _require(isinstance(steps, list) and len(steps) > 0, where, "'steps' must be a non-empty list.")
    _require(
        len(steps) == len(sections), where,
        f"{len(steps)} step spec(s) but {markdown_path.name} has {len(sections)} '## ' step section(s); they must match one to one.",
    )
    parsed = tuple(parse_step(step, i, section, where) for i, (step, section) in enumerate(zip(steps, sections)))
    return Lesson(markdown_path.stem, int(match.group(1)), title, intro, minutes, parsed)


def load_lessons(folder: Path | str = LESSONS_DIR) -> list[Lesson]:
    """Every lesson in ``folder``, in file-name order.

    Raises:
        LessonError: no lessons, a spec without its markdown, or any lesson that fails to load.
    """
    folder = Path(folder)
    markdown = sorted(folder.glob("*.md"))
    orphans = sorted({p.stem for p in folder.glob("*.json")} - {p.stem for p in markdown})
    _require(not orphans, str(folder), f"step spec(s) without a lesson text: {', '.join(o + '.json' for o in orphans)}.")
    _require(bool(markdown), str(folder), "no lessons (NN_slug.md + NN_slug.json) found.")
    return [load_lesson(path) for path in markdown]


# ---------------------------------------------------------------- running an action
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
    """

    name: str
    parameters: dict[str, tuple[type, Any]]
    scaled: dict[str, int]
    measured: tuple[str, ...]
    figures: dict[str, Callable[[ActionOutcome], go.Figure]]
    run: Callable[..., ActionOutcome]
    description: str


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
    _require(not unknown, where, f"action {kind.name!r} has no parameter(s) {sorted(unknown)} (it takes: {', '.join(kind.parameters)}).")
    for name, value in action.items():
        if name != "kind":
            kind_of = kind.parameters[name][0]
            _require(_valid(kind_of, value), where, f"action {kind.name!r}: {name!r} must be {TYPE_WORDS[kind_of]}, got {value!r}.")
    if "preset" in action:
        _require(action["preset"] in PRESETS, where, f"unknown preset {action['preset']!r} (known: {', '.join(PRESETS)}).")
    if "shared_prefix" in action:
        names = prefix.SHARED_PREFIXES
        _require(action["shared_prefix"] in names, where, f"unknown shared prefix {action['shared_prefix']!r} (known: {', '.join(names)}).")


TYPE_WORDS = {str: "non-empty text", int: "a whole number >= 1", list: "a non-empty list of whole numbers >= 1", bool: "true or false"}


def resolve_parameters(action: dict, scale: float | None = None) -> tuple[ActionKind, dict]:
    """The action's kind and full parameters: defaults, then the spec, then token counts x ``scale``.

    Raises:
        LessonError: an unknown kind or parameter, or a scale outside (0, 1].
    """
    kind = ACTION_KINDS.get(action.get("kind"))
    _require(kind is not None, "action", f"unknown action kind {action.get('kind')!r} (known: {', '.join(ACTION_KINDS)}).")
    check_parameters(kind, action, "action")
    parameters = {name: default for name, (_, default) in kind.parameters.items()}
    parameters.update({name: value for name, value in action.items() if name != "kind"})
    if scale is not None:
        _require(0 < scale <= 1, "action", f"scale must be in (0, 1], got {scale}.")
        for name, smallest in kind.scaled.items():
            value = parameters[name]
            if isinstance(value, list):
                parameters[name] = sorted({max(smallest, round(v * scale)) for v in value})
            elif value is not None:
                parameters[name] = max(smallest, round(value * scale))
    return kind, parameters


def run_action(loaded, action: dict, scale: float | None = None, progress: Progress | None = None) -> ActionOutcome:
    """Run one step's action on the real model and return what it measured.

    Args:
        loaded: the ``LoadedModel`` to run.
        action: ``{"kind": ..., parameters}`` from a step spec.
        scale: multiply the action's token counts by this, in (0, 1] (tests run small); None: as written.
        progress: called with (fraction done, what is running).

    Returns:
        The ``ActionOutcome``; ``measured`` has every name in ``ACTION_KINDS[kind].measured``.

    Raises:
        LessonError: an unknown kind or parameter.
        PrefillVizError: the run itself failed (e.g. a prompt too long for the model).
    """
    kind, parameters = resolve_parameters(action, scale)
    report = progress or (lambda fraction, text: None)
    start = time.perf_counter()
    outcome = kind.run(loaded, parameters, report, scale)
    outcome.elapsed_s = time.perf_counter() - start
    return outcome


def action_key(action: dict, loaded, settings: dict | None = None) -> str:
    """Names a run: the same action in the same step settings on the same model, device and
    dtype measures the same thing (two steps with one action share one run)."""
    identity = {"action": action, "settings": settings or {}, "model": loaded.model_id, "device": str(loaded.device), "dtype": str(loaded.dtype)}
    return json.dumps(identity, sort_keys=True)


class RunStore:
    """One session's lesson runs by ``action_key``, newest last, at most ``max_runs`` of them.

    A prefill's inspection pass holds every layer's queries, keys and values, so old runs are
    dropped; the default keeps the four runs the longest lesson needs.
    """

    def __init__(self, max_runs: int = 4) -> None:
        self.max_runs = max_runs
        self._runs: dict[str, tuple[ActionOutcome, str]] = {}  # key -> (outcome, the step that ran it)

    def __len__(self) -> int:
        return len(self._runs)

    def get(self, key: str) -> ActionOutcome | None:
        return self._runs[key][0] if key in self._runs else None

    def origin(self, key: str) -> str:
        return self._runs[key][1] if key in self._runs else ""

    def put(self, key: str, outcome: ActionOutcome, origin: str) -> None:
        self._runs.pop(key, None)  # re-inserted: the newest run is the last to go
        self._runs[key] = (outcome, origin)
        while len(self._runs) > self.max_runs:
            self._runs.pop(next(iter(self._runs)))


def _outcome(kind: str, loaded, parameters: dict, measured: dict, facts: list, raw: dict, **extra) -> ActionOutcome:
    return ActionOutcome(
        kind=kind,
        parameters=parameters,
        measured={name: float(value) for name, value in measured.items()},
        facts=facts,
        raw=raw,
        model_id=loaded.model_id,
        device=str(loaded.device),
        dtype=str(loaded.dtype).removeprefix("torch."),
        **extra,
    )


def _prompt_of(parameters: dict) -> tuple[str, str | None]:
    """(prompt text, preset name or None): a spec's own ``prompt`` wins over its ``preset``."""
    if parameters.get("prompt"):
        return parameters["prompt"], None
    return PRESETS[parameters["preset"]], parameters["preset"]


# --- prefill: the whole prompt in one step (a timing pass, then an inspection pass)
def _run_prefill(loaded, parameters: dict, report: Progress, scale: float | None = None) -> ActionOutcome:
    prompt, preset = _prompt_of(parameters)
    report(0.0, "prefill: a timing pass, then an inspection pass")
    result = run_prefill(loaded, prompt)
    record = result.timing.requests[result.request_id]
    parts = record.ttft_breakdown_s
    measured = {
        "num_tokens": result.num_tokens,
        "num_steps": result.timing.num_steps,
        "ttft_ms": parts["total_s"] * 1e3,
        "forward_ms": parts["forward_s"] * 1e3,
        "forward_share_percent": 100 * parts["forward_s"] / parts["total_s"],
        "prefill_tokens_per_s": result.num_tokens / result.timing.steps[0].forward_time_s,
    }
    facts = [
        ("Prompt tokens", f"{result.num_tokens:,}"),
        ("Engine steps to the first token", f"{result.timing.num_steps}"),
        ("Time to first token", f"{measured['ttft_ms']:,.1f} ms"),
        ("Forward pass", f"{measured['forward_ms']:,.1f} ms"),
        ("First token", repr(record.first_token_text)),
    ]
    return _outcome("prefill", loaded, parameters, measured, facts, {"prefill": result}, prompt=prompt, preset=preset)


def _ttft_breakdown_figure(outcome: ActionOutcome) -> go.Figure:
    result = outcome.raw["prefill"]
    return prefill_figures.ttft_breakdown_figure(result.timing.requests[result.request_id].ttft_breakdown_s)


# --- kv_memory: the same prefill, read as KV-cache memory (write log, blocks, GQA)
def _run_kv_memory(loaded, parameters: dict, report: Progress, scale: float | None = None) -> ActionOutcome:
    outcome = _run_prefill(loaded, parameters, report)
    run = inspect_run.from_prefill_result(outcome.raw["prefill"])
    growth = inspect_run.memory_growth(run.trace, run.request_id)
    formula = kv_memory_report(inspect_run.model_shape(run.trace, run.request_id), dtype=run.trace.dtype, num_tokens=run.num_tokens)
    usage = inspect_run.block_usage(run.trace, run.request_id, run.num_tokens)
    written = float(growth.bytes_written[-1])  # what the layers really wrote (the KV write log)
    per_token = written / run.num_tokens
    measured = {
        "num_tokens": run.num_tokens,
        "kv_bytes_per_token": per_token,
        "kv_bytes_per_token_formula": formula.bytes_per_token,
        "kv_total_mb": written / 1e6,
        "num_blocks": len(usage.block_ids),
        "block_size": usage.block_size,
        "mha_bytes_per_token": formula.mha_bytes_per_token,
        "gqa_saving_factor": formula.mha_bytes_per_token / per_token,
    }
    facts = [
        ("Prompt tokens", f"{run.num_tokens:,} ({formula.dtype})"),
        ("Written per token (KV write log)", f"{per_token:,.0f} B"),
        ("The formula", formula.formula),
        ("The whole prompt", f"{written / 1e6:,.2f} MB in {len(usage.block_ids)} blocks of {usage.block_size} tokens"),
        ("With one KV head per query head (MHA)", f"{formula.mha_bytes_per_token:,} B per token"),
    ]
    raw = {**outcome.raw, "growth": growth, "report": formula}
    return _outcome("kv_memory", loaded, parameters, measured, facts, raw, prompt=outcome.prompt, preset=outcome.preset)


def _memory_growth_figure(outcome: ActionOutcome) -> go.Figure:
    return kv_figures.memory_growth_figure(outcome.raw["growth"])


def _gqa_figure(outcome: ActionOutcome) -> go.Figure:
    return kv_figures.gqa_bars_figure(outcome.raw["report"])


# --- ttft_ratio: the time to first token of a short and a long prompt of real prose
def _ttft_s(loaded, token_ids: list[int]) -> float:
    """One parallel prefill of ``token_ids`` on a fresh engine (prefix cache off): its TTFT."""
    config = EngineConfig(token_budget=max(len(token_ids), 16), enable_prefix_caching=False)
    engine = LLMEngine(loaded.model, loaded.tokenizer, config, model_id=loaded.model_id)
    request = engine.add_request(token_ids, SamplingParams(max_new_tokens=1))
    return engine.run().requests[request.request_id].time_to_first_token_s


def _run_ttft_ratio(loaded, parameters: dict, report: Progress, scale: float | None = None) -> ActionOutcome:
    short_n, long_n, runs = parameters["short_tokens"], parameters["long_tokens"], parameters["runs"]
    if long_n <= short_n:
        raise LessonError(f"ttft_ratio: long_tokens ({long_n}) must be larger than short_tokens ({short_n}).")
    times: dict[int, list[float]] = {short_n: [], long_n: []}
    done, total = 0, 2 * (runs + 1)
    for n in (short_n, long_n):
        token_ids = bench_token_ids(loaded.tokenizer, n)
        for run in range(runs + 1):  # run 0 warms up this shape
            report(done / total, f"{n}-token prompt: run {run + 1} of {runs + 1} (the first warms up)")
            ttft = _ttft_s(loaded, token_ids)
            if run > 0:
                times[n].append(ttft)
            done += 1
    short_s, long_s = statistics.median(times[short_n]), statistics.median(times[long_n])
    measured = {
        "short_tokens": short_n,
        "long_tokens": long_n,
        "token_ratio": long_n / short_n,
        "short_ttft_ms": short_s * 1e3,
        "long_ttft_ms": long_s * 1e3,
        "ttft_ratio": long_s / short_s,
    }
    facts = [
        (f"TTFT, {short_n} tokens", f"{short_s * 1e3:,.1f} ms"),
        (f"TTFT, {long_n} tokens", f"{long_s * 1e3:,.1f} ms"),
        ("Tokens: long / short", f"{long_n / short_n:,.1f}×"),
        ("TTFT: long / short", f"{long_s / short_s:,.1f}×"),
    ]
    return _outcome("ttft_ratio", loaded, parameters, measured, facts, {"times": times})


def _ttft_bars_figure(outcome: ActionOutcome) -> go.Figure:
    times = outcome.raw["times"]
    labels = [f"{n} tokens" for n in times]
    values = [statistics.median(t) * 1e3 for t in times.values()]
    bars = go.Bar(x=labels, y=values, marker_color=style.PREFILL, text=[f"{v:,.1f} ms" for v in values], textposition="outside")
    fig = go.Figure(bars)
    fig.update_yaxes(range=[0, max(values) * 1.2])
    runs = len(next(iter(times.values())))
    title = f"Time to first token (median of {runs} runs after a warm-up)"
    return style.apply_layout(fig, title, "prompt of real prose", "time to first token (ms)", height=380)


# --- parallel_vs_sequential: the same prompt in one step and in N one-token steps
def _run_parallel(loaded, parameters: dict, report: Progress, scale: float | None = None) -> ActionOutcome:
    prompt, _ = _prompt_of(parameters)
    comparison = parallel.run_both_ways(
        loaded, prompt, max_tokens=parameters["num_tokens"], parallel_timing_runs=parameters["parallel_timing_runs"], progress=report
    )
    check = comparison.equality
    diff = max(check.max_key_diff, check.max_value_diff)
    measured = {
        "num_tokens": comparison.num_tokens,
        "parallel_ttft_ms": comparison.parallel.time_to_first_token_s * 1e3,
        "token_by_token_ttft_ms": comparison.token_by_token.time_to_first_token_s * 1e3,
        "ratio": comparison.ratio,
        "token_by_token_steps": comparison.token_by_token.num_steps,
        "max_kv_diff": diff,
        "kv_diff_over_tolerance": diff / check.tolerance,
        "logits_max_abs_diff": check.logits_max_abs_diff,
        "same_top_token": float(check.parallel_top_token_id == check.token_by_token_top_token_id),
    }
    facts = [
        ("Prompt tokens", f"{comparison.num_tokens:,}"),
        ("Parallel: time to first token", f"{measured['parallel_ttft_ms']:,.1f} ms in 1 step"),
        ("Token-by-token: time to first token", f"{measured['token_by_token_ttft_ms']:,.1f} ms in {comparison.token_by_token.num_steps} steps"),
        ("Largest K/V difference", f"{diff:.1e} (tolerance {check.tolerance:g} in {check.dtype})"),
        ("Same next token", "yes" if measured["same_top_token"] else "no"),
    ]
    return _outcome("parallel_vs_sequential", loaded, parameters, measured, facts, {"parallel": comparison})


def _step_latency_figure(outcome: ActionOutcome) -> go.Figure:
    return parallel_figures.step_latency_figure(outcome.raw["parallel"])


def _kv_difference_figure(outcome: ActionOutcome) -> go.Figure:
    return parallel_figures.kv_difference_figure(outcome.raw["parallel"].equality)


# --- roofline: measured prefill and decode steps under this machine's measured roofs
def _run_roofline(loaded, parameters: dict, report: Progress, scale: float | None = None) -> ActionOutcome:
    report(0.0, "reading (or measuring) this machine's peaks, then timing prefill and decode steps")
    result = parallel.run_roofline(loaded, parameters["prefill_sizes"], parameters["decode_contexts"], parameters["runs"])
    prefill_points = [p for p in result.points if p.phase == "prefill"]
    decode_points = [p for p in result.points if p.phase == "decode"]
    if not prefill_points or not decode_points:
        raise LessonError("roofline: the model's context is too short for these prefill sizes and decode contexts.")
    prefill_point = max(prefill_points, key=lambda p: p.num_tokens)
    decode_point = min(decode_points, key=lambda p: p.context_len)
    peaks = result.peaks
    measured = {
        "prefill_tokens": prefill_point.num_tokens,
        "prefill_intensity": prefill_point.intensity,
        "decode_intensity": decode_point.intensity,
        "intensity_ratio": prefill_point.intensity / decode_point.intensity,
        "ridge_intensity": peaks.ridge_intensity,
        "prefill_over_ridge": prefill_point.intensity / peaks.ridge_intensity,
        "prefill_gflops": prefill_point.achieved_gflops,
        "decode_gflops": decode_point.achieved_gflops,
        "gflops_ratio": prefill_point.achieved_gflops / decode_point.achieved_gflops,
        "prefill_percent_of_peak": 100 * prefill_point.achieved_gflops / peaks.matmul_gflops,
    }
    facts = [
        (f"Prefill step, N={prefill_point.num_tokens}", f"{prefill_point.intensity:,.1f} FLOP/byte · {prefill_point.achieved_gflops:,.1f} GFLOP/s"),
        (f"Decode step, context {decode_point.context_len}", f"{decode_point.intensity:,.2f} FLOP/byte · {decode_point.achieved_gflops:,.1f} GFLOP/s"),
        ("Ridge point (where the roofs meet)", f"{peaks.ridge_intensity:,.1f} FLOP/byte"),
        (f"Prefill N={prefill_point.num_tokens}", _side_of_ridge(prefill_point.intensity, peaks.ridge_intensity)),
        (f"Decode, context {decode_point.context_len}", _side_of_ridge(decode_point.intensity, peaks.ridge_intensity)),
        ("This machine's roofs (measured)", f"{peaks.matmul_gflops:,.0f} GFLOP/s matmul · {peaks.memory_gb_s:,.1f} GB/s memory"),
    ]
    return _outcome("roofline", loaded, parameters, measured, facts, {"roofline": result})


def _side_of_ridge(intensity: float, ridge: float) -> str:
    if intensity >= ridge:
        return f"right of the ridge ({intensity / ridge:,.1f}× its intensity): compute-bound"
    return f"left of the ridge ({ridge / intensity:,.1f}× below it): memory-bound"


def _roofline_figure(outcome: ActionOutcome) -> go.Figure:
    result = outcome.raw["roofline"]
    return parallel_figures.roofline_figure(result.peaks, result.points)


# --- chunked: a long prompt arrives while short requests decode; chunking off vs on
def _run_chunked(loaded, parameters: dict, report: Progress, scale: float | None = None) -> ActionOutcome:
    workload = chunked.build_workload(
        loaded.tokenizer,
        num_short_requests=parameters["num_short_requests"],
        short_prompt_tokens=parameters["short_prompt_tokens"],
        short_max_new_tokens=parameters["short_max_new_tokens"],
        long_prompt_tokens=parameters["long_prompt_tokens"],
        long_max_new_tokens=parameters["long_max_new_tokens"],
        arrival_step=parameters["arrival_step"],
        token_budget=parameters["token_budget"],
    )
    total = workload.estimated_num_steps(False) + workload.estimated_num_steps(True)

    def progress(done: int, record) -> None:
        report(min(1.0, done / total), f"chunking off, then on: step {done} of ~{total}")

    comparison = chunked.compare_chunking(loaded.model, workload, progress, loaded.model_id)
    off, on = comparison.summary_off, comparison.summary_on
    measured = {
        "itl_max_off_ms": off.itl_max_ms,
        "itl_max_on_ms": on.itl_max_ms,
        "itl_max_ratio": off.itl_max_ms / on.itl_max_ms,
        "long_ttft_off_ms": off.long_ttft_ms,
        "long_ttft_on_ms": on.long_ttft_ms,
        "long_ttft_ratio": on.long_ttft_ms / off.long_ttft_ms,
        "num_steps_off": off.num_steps,
        "num_steps_on": on.num_steps,
        "outputs_identical": float(all(check.identical for check in comparison.output_checks)),
    }
    facts = [
        ("Worst gap between tokens of a decoding user, chunking off", f"{off.itl_max_ms:,.0f} ms"),
        ("… with chunking on", f"{on.itl_max_ms:,.0f} ms"),
        ("Long prompt's TTFT, off → on", f"{off.long_ttft_ms:,.0f} ms → {on.long_ttft_ms:,.0f} ms"),
        ("Engine steps, off → on", f"{off.num_steps} → {on.num_steps}"),
        ("Same tokens generated", "yes" if measured["outputs_identical"] else "no"),
    ]
    return _outcome("chunked", loaded, parameters, measured, facts, {"chunked": comparison})


def _chunked_latency_figure(outcome: ActionOutcome) -> go.Figure:
    comparison = outcome.raw["chunked"]
    summaries = {"chunking off": comparison.summary_off, "chunking on": comparison.summary_on}
    return chunked_figures.latency_figure(summaries, "Decoding users' inter-token latency (ITL) and the long prompt's TTFT")


# --- prefix: questions sharing a prefix, one after another on one engine, prefix cache on vs off
def _run_prefix(loaded, parameters: dict, report: Progress, scale: float | None = None) -> ActionOutcome:
    prefix_text, template = prefix.SHARED_PREFIXES[parameters["shared_prefix"]]
    prefix_ids = loaded.tokenizer(prefix_text)["input_ids"]
    keep = parameters["prefix_tokens"] or len(prefix_ids)
    if scale is not None and parameters["prefix_tokens"] is None:
        keep = max(ACTION_KINDS["prefix"].scaled["prefix_tokens"], round(len(prefix_ids) * scale))
    if keep < len(prefix_ids):  # the first tokens of the same text
        prefix_text = loaded.tokenizer.decode(prefix_ids[:keep])
    questions = list(prefix.QUESTIONS[: parameters["num_questions"]])
    if len(questions) < 2:
        raise LessonError("prefix: needs at least 2 questions (the first computes the prefix, the later ones can hit it).")
    stream = prefix.build_stream(loaded.tokenizer, prefix_text, questions, template, parameters["max_new_tokens"], other_user_after=None)
    total = prefix.estimated_num_steps(stream, False)

    def progress(done: int, record) -> None:
        report(min(1.0, done / total), f"cache on, then off: step {done} of ~{total}")

    experiment = prefix.run_prefix_experiment(loaded.model, stream, None, progress, loaded.model_id)
    later = stream.request_ids[1:]  # every request after the first can hit the prefix
    on, off = experiment.cache_on.trace.requests, experiment.cache_off.trace.requests
    ttft_on = statistics.mean(on[rid].time_to_first_token_s for rid in later)
    ttft_off = statistics.mean(off[rid].time_to_first_token_s for rid in later)
    queries, hits = experiment.cache_on.counters[-1]
    checks = prefix.compare_outputs(experiment.cache_off, experiment.cache_on)
    measured = {
        "num_shared_prefix_tokens": stream.num_shared_prefix_tokens,
        "later_cached_percent": statistics.mean(100 * on[rid].num_cached_tokens / on[rid].num_prompt_tokens for rid in later),
        "hit_rate_percent": 100 * hits / queries,
        "later_ttft_on_ms": ttft_on * 1e3,
        "later_ttft_off_ms": ttft_off * 1e3,
        "ttft_speedup": ttft_off / ttft_on,
        "outputs_identical": float(all(check.identical for check in checks)),
    }
    full_blocks, block_size = stream.num_shared_full_blocks, stream.block_size
    facts = [
        ("Shared prefix", f"{stream.num_shared_prefix_tokens:,} tokens: {full_blocks} full blocks of {block_size} + {stream.num_shared_prefix_tokens - full_blocks * block_size}"),
        ("Requests after the first: prompt tokens from the cache", f"{measured['later_cached_percent']:.0f}%"),
        ("Their time to first token, cache off → on", f"{ttft_off * 1e3:,.0f} ms → {ttft_on * 1e3:,.0f} ms"),
        ("prefix_cache_hits / prefix_cache_queries", f"{hits:,} / {queries:,} tokens"),
        ("Same tokens generated", "yes" if measured["outputs_identical"] else "no"),
    ]
    return _outcome("prefix", loaded, parameters, measured, facts, {"prefix": experiment})


def _prefix_ttft_figure(outcome: ActionOutcome) -> go.Figure:
    return prefix_figures.ttft_figure(outcome.raw["prefix"], "Time to first token of each request, prefix cache on vs off")


PROMPT_PARAMETERS = {"preset": (str, "Chat with a system prompt"), "prompt": (str, None)}  # a spec's "prompt" wins

ACTION_KINDS: dict[str, ActionKind] = {
    kind.name: kind
    for kind in [
        ActionKind(
            name="prefill",
            parameters=PROMPT_PARAMETERS,
            scaled={},
            measured=("num_tokens", "num_steps", "ttft_ms", "forward_ms", "forward_share_percent", "prefill_tokens_per_s"),
            figures={"ttft_breakdown": _ttft_breakdown_figure},
            run=_run_prefill,
            description="One parallel prefill of the prompt (timing pass, then inspection pass); the Prefill page shows it.",
        ),
        ActionKind(
            name="ttft_ratio",
            parameters={"short_tokens": (int, 32), "long_tokens": (int, 512), "runs": (int, 3)},
            scaled={"short_tokens": 4, "long_tokens": 8},
            measured=("short_tokens", "long_tokens", "token_ratio", "short_ttft_ms", "long_ttft_ms", "ttft_ratio"),
            figures={"ttft_bars": _ttft_bars_figure},
            run=_run_ttft_ratio,
            description="Time to first token of a short and a long prompt of real prose (median of runs after a warm-up).",
        ),
        ActionKind(
            name="parallel_vs_sequential",
            parameters={**PROMPT_PARAMETERS, "preset": (str, "Long document"), "num_tokens": (int, 400), "parallel_timing_runs": (int, 3)},
            scaled={"num_tokens": 8},
            measured=(
                "num_tokens", "parallel_ttft_ms", "token_by_token_ttft_ms", "ratio", "token_by_token_steps", "max_kv_diff",
                "kv_diff_over_tolerance", "logits_max_abs_diff", "same_top_token",
            ),
            figures={"step_latency": _step_latency_figure, "kv_difference": _kv_difference_figure},
            run=_run_parallel,
            description="The prompt's first N tokens in one step and in N one-token steps: timed, then their KV caches compared.",
        ),
        ActionKind(
            name="roofline",
            parameters={"prefill_sizes": (list, [16, 64, 256]), "decode_contexts": (list, [64]), "runs": (int, 2)},
            scaled={"prefill_sizes": 4, "decode_contexts": 4},
            measured=(
                "prefill_tokens", "prefill_intensity", "decode_intensity", "intensity_ratio", "ridge_intensity", "prefill_over_ridge",
                "prefill_gflops", "decode_gflops", "gflops_ratio", "prefill_percent_of_peak",
            ),
            figures={"roofline": _roofline_figure},
            run=_run_roofline,
            description="Prefill and decode steps, timed and placed under this machine's measured roofs.",
        ),
        ActionKind(
            name="kv_memory",
            parameters=PROMPT_PARAMETERS,
            scaled={},
            measured=(
                "num_tokens", "kv_bytes_per_token", "kv_bytes_per_token_formula", "kv_total_mb", "num_blocks", "block_size",
                "mha_bytes_per_token", "gqa_saving_factor",
            ),
            figures={"memory_growth": _memory_growth_figure, "gqa_bars": _gqa_figure},
            run=_run_kv_memory,
            description="One prefill read as KV-cache memory: the bytes the layers wrote, the blocks, what GQA saves.",
        ),
        ActionKind(
            name="chunked",
            parameters={
                "num_short_requests": (int, 3), "short_prompt_tokens": (int, 16), "short_max_new_tokens": (int, 12),
                "long_prompt_tokens": (int, 512), "long_max_new_tokens": (int, 2), "arrival_step": (int, 2), "token_budget": (int, 64),
            },
            scaled={"short_max_new_tokens": 4, "long_prompt_tokens": 16, "token_budget": 8},
            measured=(
                "itl_max_off_ms", "itl_max_on_ms", "itl_max_ratio", "long_ttft_off_ms", "long_ttft_on_ms", "long_ttft_ratio",
                "num_steps_off", "num_steps_on", "outputs_identical",
            ),
            figures={"latency": _chunked_latency_figure},
            run=_run_chunked,
            description="A long prompt arriving while short requests decode, with chunked prefill off and on.",
        ),
        ActionKind(
            name="prefix",
            parameters={
                "shared_prefix": (str, "Questions about one long document"), "num_questions": (int, 3),
                "max_new_tokens": (int, 2), "prefix_tokens": (int, None),
            },
            scaled={"prefix_tokens": 40},
            measured=(
                "num_shared_prefix_tokens", "later_cached_percent", "hit_rate_percent", "later_ttft_on_ms", "later_ttft_off_ms",
                "ttft_speedup", "outputs_identical",
            ),
            figures={"ttft": _prefix_ttft_figure},
            run=_run_prefix,
            description="Questions sharing a prefix, one after another on one engine, with the prefix cache on and off.",
        ),
    ]
}


def page_results(outcome: ActionOutcome, label: str) -> dict[str, Any]:
    """``save_result`` keys and values that make the step's full view show this same run.

    Args:
        outcome: the step's run.
        label: how the chunked and prefix pages caption their times (``run_label`` + threads).
    """
    raw = outcome.raw
    if outcome.kind in ("prefill", "kv_memory"):
        return {"prefill": raw["prefill"]}
    if outcome.kind == "parallel_vs_sequential":
        return {"parallel": raw["parallel"]}
    if outcome.kind == "roofline":
        return {"parallel_roofline": raw["roofline"]}
    if outcome.kind == "chunked":
        return {"chunked": {"comparison": raw["chunked"], "label": label}}
    if outcome.kind == "prefix":
        return {"prefix": {"experiment": raw["prefix"], "label": label}}
    return {}


def page_state(outcome: ActionOutcome) -> dict[str, str]:
    """Other pages' widget values a step sets: the Prefill page's prompt (and preset) after a prefill."""
    if outcome.prompt is None:
        return {}
    state = {"prefill_prompt": outcome.prompt}
    if outcome.preset is not None:
        state["prefill_preset"] = outcome.preset
    return state


def step_figure(step: Step, outcome: ActionOutcome) -> go.Figure:
    """The step's figure, drawn from its run."""
    return ACTION_KINDS[outcome.kind].figures[step.figure](outcome)


# ---------------------------------------------------------------- the reveal
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
        return Reveal(measured_text, picked, f"Not this time: you picked “{picked}”, the measurement falls in “{answer}”.", False)
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
        return Reveal(measured_text, prediction_text, "The measurement is not positive, so there is no factor to compare.", False)
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
