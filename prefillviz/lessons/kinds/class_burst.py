"""The ``class_burst`` action: the whole class presses *Send* at once. N student-sized prompts arrive together
at the engine as ``prefillviz serve`` runs it (``experiments.class_burst``): when does the last first token come,
how many steps did it take, and how many prompts shared each step."""

from __future__ import annotations

import plotly.graph_objects as go

from prefillviz.experiments import class_burst
from prefillviz.experiments.served_engine import SERVED_DEFAULTS
from prefillviz.figures.class_burst import burst_ttft_figure
from prefillviz.lessons.actions import ActionKind, ActionOutcome
from prefillviz.lessons.kinds.common import make_outcome
from prefillviz.machine.progress import FractionProgress


def burst_numbers(burst: class_burst.ClassBurst) -> dict[str, float]:
    """What the burst measured, by the names the lesson's question and text use."""
    return {
        "num_students": burst.num_students,
        "max_num_running": burst.max_num_running,
        "students_per_slot": burst.num_students / burst.max_num_running,  # above 1: some wait for a running slot
        "token_budget": burst.token_budget,
        "max_new_tokens": burst.max_new_tokens,
        "mean_prompt_tokens": burst.mean_prompt_tokens,
        "first_ttft_ms": 1e3 * burst.first_ttft_s,
        "median_ttft_ms": 1e3 * burst.median_ttft_s,
        "last_ttft_ms": 1e3 * burst.last_ttft_s,
        "last_over_first_ttft": burst.last_ttft_s / burst.first_ttft_s,
        "steps_to_last_first_token": burst.steps_to_last_first_token,
        "max_prompts_per_step": burst.max_prompts_per_step,
        "num_prompt_steps": len(burst.prompt_steps),
        "num_waited": burst.num_waited,
        "cached_percent": 100 * burst.cached_fraction,
    }


def prompts_per_step_text(burst: class_burst.ClassBurst) -> str:
    """``16 in step 0, 14 in step 32``: the steps that ran prompts, and how many."""
    return ", ".join(f"{step.num_prompts} in step {step.index}" for step in burst.prompt_steps)


def _run_class_burst(loaded, parameters: dict, report: FractionProgress, scale: float | None = None) -> ActionOutcome:
    num_students, max_new_tokens = parameters["num_students"], parameters["max_new_tokens"]
    max_num_running = parameters["max_num_running"]
    total = class_burst.estimated_num_steps(num_students, max_num_running, max_new_tokens)

    def progress(done: int, record) -> None:
        report(min(1.0, done / total), f"{num_students} students at once: step {done} of ~{total}")

    report(0.0, "warming the served engine up (a full batch, as the server does)")
    burst = class_burst.run_class_burst(loaded, num_students, max_new_tokens, max_num_running, progress)
    measured = burst_numbers(burst)
    facts = [
        ("Sent at once", f"{burst.num_students} student prompts of {burst.mean_prompt_tokens:,.0f} tokens on average "
                         f"(the chat template and a question), up to {burst.max_new_tokens} new tokens each, greedy"),
        ("The engine (the server's defaults)", f"a token budget of {burst.token_budget:,} per step, at most "
                                               f"{burst.max_num_running} requests running at once, prefix cache on"),
        ("Time to first token: first, median, last",
         f"{burst.first_ttft_s * 1e3:,.1f} ms, {burst.median_ttft_s * 1e3:,.1f} ms, {burst.last_ttft_s * 1e3:,.1f} ms "
         f"({burst.last_ttft_s / burst.first_ttft_s:,.1f}× the first)"),
        ("Steps to the last first token", f"{burst.steps_to_last_first_token} (of {len(burst.steps)} in the burst)"),
        ("Prompts per step", prompts_per_step_text(burst)),
        ("Students who waited for a later step", f"{burst.num_waited} of {burst.num_students}"),
        ("Prompt tokens from the prefix cache", f"{burst.cached_fraction:.0%}"),
        ("Before the burst", f"the engine warmed up as the server does (a full batch of short requests, "
                             f"{burst.warm_up_s:,.1f} s)"),
    ]
    return make_outcome("class_burst", loaded, parameters, measured, facts, {"class_burst": burst})


def _burst_figure(outcome: ActionOutcome) -> go.Figure:
    return burst_ttft_figure(outcome.raw["class_burst"])


KIND = ActionKind(
    name="class_burst",
    parameters={
        "num_students": (int, 30),
        "max_new_tokens": (int, class_burst.STUDENT_MAX_NEW_TOKENS),
        "max_num_running": (int, SERVED_DEFAULTS.max_num_running),  # the server's --max-num-seqs
    },
    scaled={"num_students": 4, "max_new_tokens": 3, "max_num_running": 2},  # small: still two waves of students
    measured=(
        "num_students", "max_num_running", "students_per_slot", "token_budget", "max_new_tokens", "mean_prompt_tokens",
        "first_ttft_ms", "median_ttft_ms", "last_ttft_ms", "last_over_first_ttft", "steps_to_last_first_token",
        "max_prompts_per_step", "num_prompt_steps", "num_waited", "cached_percent",
    ),
    figures={"burst_ttft": _burst_figure},
    run=_run_class_burst,
    description="A class's prompts sent at once to the served engine: each TTFT in arrival order, steps, sharing.",
)
