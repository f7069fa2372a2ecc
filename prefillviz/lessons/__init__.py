"""Guided lessons: lesson files, checked when loaded, and the real model runs behind their steps.

A lesson is two files with the same stem under ``assets/lessons/``:

    01_prefill_and_ttft.md      # Title            <- the lesson's title
                                # intro text
                                # ## Step title    <- one section per step: the narration
                                # ### After the reveal   (shown after the reveal: {measured} numbers,
                                #   "#### If name < number" variants chosen by the run, "#### Otherwise")
    01_prefill_and_ttft.json    {"minutes": 7, "steps": [one spec per "## " section, in order]}

A step spec says what the step does to the app and asks:

    {"action":   {"kind": "prefill", "preset": "Short question"},   # what runs on the model
     "view":     "views/prefill.py",                                # the full view of that run
     "figure":   "ttft_breakdown",                                  # optional: which figure
     "settings": {"dtype": "float32"},                              # optional: sidebar settings
     "question": {"kind": "number", "text": "...", "answer": "ttft_ratio",
                  "options": [1, 2, 4, 8, 16], "default": 4, "unit": "×"}}

Every action runs the real model through the experiments the pages use (``experiments.prefill``,
``parallel``, ``chunked``, ``prefix``, ``replay_runs``, ``sparse_prefill``, ``class_burst``; ``analysis.memory``) and
returns **measured numbers by name**; a question names the number that answers it
(``ACTION_KINDS[kind].measured``). A "choice" question sorts the measured number into the first
option whose ``up_to`` it does not exceed (the last option takes the rest). Nothing is hard-coded:
the reveal shows what this run measured. This package does not import streamlit; ``views/walkthrough.py`` draws it.

The modules, in import order:

    spec.py          Lesson, Step, Question, Choice; LessonError; where lessons live, step settings
    actions.py       ActionKind, ActionOutcome, check_parameters
    kinds/           one module an action kind: its real model run, the figures its step can
                     name, the results its page shows, and its KIND registration
    registry.py      ACTION_KINDS (one line a kind); resolve_parameters, run_action
    loading.py       parse and check the .md/.json pair: load_lesson, load_lessons
    run_store.py     action_key, RunStore: a session's runs
    views.py         step_figure, step_after_reveal; page_results, page_state: hand a run to its full view
    reveal.py        format_reveal, format_value, choice_for: the prediction vs the measurement
    reveal_text.py   the after-reveal text of a run: measured {placeholders}, "#### If" variants
    claims.py        statements true only on some runs, and the guard each needs (checked in the tests)
    glossary.py      the glossary beside every step: load_glossary, glossary_markdown
"""

from __future__ import annotations

# what the walkthrough page and the tests use; the rest is reached through its module
from prefillviz.lessons.actions import ActionOutcome
from prefillviz.lessons.glossary import glossary_markdown, load_glossary
from prefillviz.lessons.loading import load_lessons
from prefillviz.lessons.registry import ACTION_KINDS, resolve_parameters, run_action
from prefillviz.lessons.reveal import choice_for, format_reveal, format_value
from prefillviz.lessons.run_store import RunStore, action_key
from prefillviz.lessons.spec import LESSONS_DIR, ROOT, SETTINGS, Lesson, LessonError, Question
from prefillviz.lessons.views import page_results, page_state, step_after_reveal, step_figure

__all__ = [
    "ACTION_KINDS",
    "ActionOutcome",
    "LESSONS_DIR",
    "Lesson",
    "LessonError",
    "Question",
    "ROOT",
    "RunStore",
    "SETTINGS",
    "action_key",
    "choice_for",
    "format_reveal",
    "format_value",
    "glossary_markdown",
    "load_glossary",
    "load_lessons",
    "page_results",
    "page_state",
    "resolve_parameters",
    "run_action",
    "step_after_reveal",
    "step_figure",
]
