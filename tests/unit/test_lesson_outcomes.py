"""Every lesson step read under four simulated machines: no sentence a student sees contradicts the
injected measurements, checked through the same guards (``lessons.claims``, the reveal variants'
condition grammar) that pick the text after each reveal."""

import re

import pytest

from prefillviz import lessons
from prefillviz.lessons import ACTION_KINDS, load_lessons
from prefillviz.lessons.claims import CLAIMS, NEVER, contradictions
from prefillviz.lessons.reveal_text import PLACEHOLDER, RUN_NUMBERS, parse_condition

LESSONS = load_lessons()

# The numbers every kind may measure, as each machine would give them. A name no scenario sets is 3.
COMMON = {"outputs_identical": 1, "kv_diff_over_tolerance": 0.2, "one_short_cached": 0, "overhead_falls": 1,
          "gqa_saving_factor": 3, "has_crossover": 0, "crossover_tokens": 0,
          # one step writes layer by layer, token by token one position through every layer, on any device
          "positions_before_next_layer": 64, "token_by_token_positions_before_next_layer": 1,
          # 30 students, 16 running slots: a second wave waits for the first's answers, on any device
          "students_per_slot": 1.875, "num_waited": 14, "steps_to_last_first_token": 33}
SCENARIOS = {
    # a CPU in float32: a low ridge, compute-bound after a few dozen tokens, weights read in most of a flat step
    "cpu, low ridge": ("cpu", "float32", "SmolLM2-135M-Instruct", COMMON | {
        "ridge_intensity": 8, "ridge_tokens": 12, "prefill_over_ridge": 9, "past_ridge_over_ridge": 9,
        "ttft_ratio": 24, "ttft_over_flop_ratio": 1.5, "flop_ttft_ratio": 16, "arrival_gap_ratio": 6,
        "long_ttft_ratio": 1.1, "ttft_speedup": 6, "placement_kind": 0, "disagg_ttft_ratio": 1.6,
        "disagg_itl_growth": 3, "weights_read_share": 0.8, "knee_tokens": 16, "piggyback_ratio": 2,
        "mixed_over_prefill": 1.02, "kv_at_context_over_weights": 0.7,
        "sparse_ttft_speedup": 0.24, "sparse_attention_speedup": 0.1, "speedup_over_amdahl_cap": 0.21}),
    # a CPU with AMX in bfloat16: a ridge in the hundreds, the 256-token prefill still memory-bound
    "cpu, AMX bf16": ("cpu", "bfloat16", "SmolLM2-135M-Instruct", COMMON | {
        "ridge_intensity": 300, "ridge_tokens": 400, "prefill_over_ridge": 0.5, "past_ridge_over_ridge": 1.6,
        "ttft_ratio": 5, "ttft_over_flop_ratio": 0.3, "flop_ttft_ratio": 16, "arrival_gap_ratio": 2.5,
        "long_ttft_ratio": 1.3, "ttft_speedup": 3, "placement_kind": 0, "disagg_ttft_ratio": 1.8,
        "disagg_itl_growth": 2.5, "weights_read_share": 0.3, "knee_tokens": 300, "piggyback_ratio": 8,
        "mixed_over_prefill": 1.05, "kv_at_context_over_weights": 0.7,
        "sparse_ttft_speedup": 0.6, "sparse_attention_speedup": 0.3, "speedup_over_amdahl_cap": 0.5}),
    # a GPU running a small model: every step launch-bound, nothing grows with the prompt
    "gpu, launch-bound": ("cuda:0", "bfloat16", "SmolLM2-135M-Instruct", COMMON | {
        "ridge_intensity": 300, "ridge_tokens": 330, "prefill_over_ridge": 0.4, "past_ridge_over_ridge": 1.6,
        "ttft_ratio": 1.1, "ttft_over_flop_ratio": 0.07, "flop_ttft_ratio": 16, "arrival_gap_ratio": 1.1,
        "long_ttft_ratio": 1.0, "ttft_speedup": 1.1, "placement_kind": 1, "disagg_ttft_ratio": 1.0,
        "disagg_itl_growth": 1.5, "weights_read_share": 0.05, "knee_tokens": 500, "piggyback_ratio": 20,
        "mixed_over_prefill": 1.0, "kv_at_context_over_weights": 0.7,
        "sparse_ttft_speedup": 1.1, "sparse_attention_speedup": 1.5, "speedup_over_amdahl_cap": 0.95}),
    # a GPU running a bigger model on a GPU each: compute-bound prefill, a crossover, a cache past the weights
    "gpu, compute-bound": ("cuda:0", "bfloat16", "Qwen2.5-1.5B-Instruct", COMMON | {
        "ridge_intensity": 150, "ridge_tokens": 160, "prefill_over_ridge": 1.4, "past_ridge_over_ridge": 1.4,
        "ttft_ratio": 14, "ttft_over_flop_ratio": 1.4, "flop_ttft_ratio": 16, "arrival_gap_ratio": 5,
        "long_ttft_ratio": 1.2, "ttft_speedup": 8, "placement_kind": 2, "disagg_ttft_ratio": 1.0,
        "disagg_itl_growth": 1.2, "weights_read_share": 0.7, "knee_tokens": 150, "piggyback_ratio": 60,
        "mixed_over_prefill": 1.3, "kv_at_context_over_weights": 1.3, "has_crossover": 1, "crossover_tokens": 256,
        "sparse_ttft_speedup": 1.4, "sparse_attention_speedup": 3, "speedup_over_amdahl_cap": 1.05}),
}


def outcome(step, scenario: str) -> lessons.ActionOutcome:
    device, dtype, model_id, numbers = SCENARIOS[scenario]
    kind = ACTION_KINDS[step.action["kind"]]
    measured = {name: float(numbers.get(name, 3.0)) for name in kind.measured}
    return lessons.ActionOutcome(kind.name, {}, measured, [], {}, model_id, device, dtype)


STEPS = [(lesson, step) for lesson in LESSONS for step in lesson.steps]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_sentence_of_any_step_contradicts_the_run_it_is_shown_with(scenario):
    for lesson, step in STEPS:
        run = outcome(step, scenario)
        after = lessons.step_after_reveal(step, run)
        assert not PLACEHOLDER.search(after), (lesson.slug, step.index + 1, after)
        shown = "\n".join([lesson.intro, step.narration, step.question.text, after])
        found = contradictions(shown, run)
        assert not found, (scenario, lesson.slug, step.index + 1, found)


def test_the_four_machines_pick_different_texts_through_the_guards():
    """Not vacuous: across the four machines the guarded statements of both sides appear."""
    matched = set()
    for scenario in SCENARIOS:
        for _, step in STEPS:
            text = lessons.step_after_reveal(step, outcome(step, scenario))
            matched |= {claim.pattern for claim in CLAIMS if claim.guard != NEVER and _has(claim, text)}
    for pattern in (r"\bcores\b", r"CPU caches?", r"set by reading the weights", r"launch and host overhead",
                    r"still less than the model's own weights", r"more than the model's own weights",
                    r"ridge is low|compute-bound after a few tokens", r"ridge is high", r"still left of the ridge",
                    r"prefill is right of the ridge", r"\bshare one GPU\b", r"GPU of its own", r"\blayer by layer\b",
                    r"slower than dense", r"faster than dense", r"within it, as Amdahl",
                    r"earlier students' answers, not their prefills",
                    r"of the prompt tokens came from the prefix cache"):
        assert pattern in matched, pattern


def _has(claim, text: str) -> bool:
    return re.search(claim.pattern, text, flags=re.IGNORECASE) is not None


@pytest.mark.parametrize(
    "sentence, scenario, kind",
    [  # the statements the lessons used to make, each caught on a machine where it is false
        ("The long prompt's activations overflow the CPU caches the short one fits in.", "gpu, compute-bound",
         "ttft_ratio"),
        ("A CPU's ridge is low and a few dozen tokens reach it.", "cpu, AMX bf16", "roofline"),
        ("So the longer the prompt, the cheaper the transfer is next to the prefill.", "gpu, compute-bound", "disagg"),
        ("The step runs C = 256 tokens on 2 cores.", "cpu, low ridge", "papers_piggyback"),
        ("A 135M-parameter model's matrices are too small.", "gpu, compute-bound", "roofline"),
        ("The sidebar goes back to auto (the fastest dtype for this machine).", "gpu, launch-bound", "kv_memory"),
        ("Here both workers split its cores.", "gpu, launch-bound", "disagg"),
        ("Up to the knee the flat TTFT is set by reading the weights.", "gpu, launch-bound", "papers_knee"),
        ("At its whole context one request is still less than the model's own weights.", "gpu, compute-bound",
         "kv_memory"),
        ("Its TTFT is close to one engine's.", "cpu, low ridge", "disagg"),
        ("Block-sparse prefill was slower than dense here.", "gpu, compute-bound", "sparse_speedup"),
        ("Block-sparse prefill was 3× faster than dense end to end.", "cpu, AMX bf16", "sparse_speedup"),
        ("That is 0.9 of the cap, within it, as Amdahl's law says it must be.", "gpu, compute-bound",
         "sparse_speedup"),
        ("One step gave every first token.", "cpu, AMX bf16", "class_burst"),
        ("No prompt token came from the prefix cache.", "cpu, low ridge", "class_burst"),
    ],
)
def test_an_unguarded_statement_is_caught_where_the_run_contradicts_it(sentence, scenario, kind):
    step = next(s for _, s in STEPS if s.action["kind"] == kind)
    assert contradictions(sentence, outcome(step, scenario))


def test_every_guard_names_a_number_some_run_gives():
    """A guard naming a number no action measures would never be checked: the claim would pass everywhere."""
    measured = {name for kind in ACTION_KINDS.values() for name in kind.measured} | set(RUN_NUMBERS)
    for claim in CLAIMS:
        if claim.guard != NEVER:
            names = re.findall(r"[a-z_]+", claim.guard.replace(" and ", " "))
            conditions = parse_condition(claim.guard, tuple(names), "test")
            assert {c.name for c in conditions} <= measured, claim
