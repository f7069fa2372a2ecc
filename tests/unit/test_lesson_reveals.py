"""The text after each reveal is written from the run: for every step, injected results of each
possible outcome pick the explanation of that outcome, name the device, and leave no blank."""

import math

import pytest

from prefillviz import lessons
from prefillviz.lessons import ACTION_KINDS, LessonError, load_lessons
from prefillviz.lessons.reveal_text import PLACEHOLDER, chosen_variant, parse_after_reveal

LESSONS = {lesson.number: lesson for lesson in load_lessons()}
DEVICE, DTYPE = "cuda:0", "bfloat16"


MODEL = "SmolLM2-135M-Instruct"


def outcome_of(step, device: str = DEVICE, **measured) -> lessons.ActionOutcome:
    kind = ACTION_KINDS[step.action["kind"]]
    values = {name: 3.0 for name in kind.measured} | {name: float(value) for name, value in measured.items()}
    return lessons.ActionOutcome(kind.name, {}, values, [], {}, MODEL, device, DTYPE)


def text_of(lesson: int, step: int, device: str = DEVICE, **measured) -> str:
    chosen = LESSONS[lesson].steps[step - 1]
    return lessons.step_after_reveal(chosen, outcome_of(chosen, device, **measured))


def bounds(step) -> list[tuple[str, float]]:
    """(name, bound) of every variant condition of a step."""
    _, variants = parse_after_reveal(step.after_reveal, ACTION_KINDS[step.action["kind"]], "test")
    return [(v.name, v.bound) for v in variants if v.name is not None]


ALL_STEPS = [(lesson.number, step.index + 1) for lesson in LESSONS.values() for step in lesson.steps]


@pytest.mark.parametrize("lesson, step", ALL_STEPS)
def test_every_outcome_of_every_step_gets_a_filled_text(lesson, step):
    chosen = LESSONS[lesson].steps[step - 1]
    # both sides of every condition, and the extremes of the answer: each picks a text with every number filled in
    cases = [{}, {chosen.question.answer: 0.0}, {chosen.question.answer: 1e4}]
    for name, bound in bounds(chosen):
        cases += [{name: bound - abs(bound) * 0.1 - 0.01}, {name: bound + abs(bound) * 0.1 + 0.01}]
    # a condition on what ran (on_gpu, dtype_bytes) is met by the device, not by an injected number
    texts = {text_of(lesson, step, device, **case) for case in cases for device in ("cpu", DEVICE)}
    for text in texts:
        assert text and not PLACEHOLDER.search(text), text
    if bounds(chosen):  # a step whose explanation depends on the outcome: several texts, each naming what ran
        assert len(texts) >= 2
        assert all("cpu" in text or DEVICE in text or MODEL in text for text in texts), texts


# (lesson, step, injected results, a phrase the text must have, a phrase it must not have): both outcomes of each step
AGREES = [
    (1, 1, {"num_steps": 3, "num_tokens": 70, "token_budget": 24}, "3 steps for 70 prompt tokens", "One step"),
    (1, 1, {"engine_default_budget": 2048}, "an engine built without a budget gets\n2,048 tokens", "default is"),
    (1, 3, {"ttft_ratio": 1.2, "ttft_over_flop_ratio": 0.07}, "TTFT hardly grew", "close to the FLOPs"),
    (1, 3, {"ttft_ratio": 9, "ttft_over_flop_ratio": 0.53}, "less than the FLOPs", "hardly grew"),
    (1, 3, {"ttft_ratio": 17, "ttft_over_flop_ratio": 1.0}, "close to the FLOPs", "less than the FLOPs"),
    (1, 3, {"ttft_ratio": 30, "ttft_over_flop_ratio": 1.75}, "GPU's on-chip caches", "CPU caches"),
    (1, 3, {"device": "cpu", "ttft_ratio": 30, "ttft_over_flop_ratio": 1.75}, "CPU caches", "GPU's on-chip"),
    (2, 2, {"kv_diff_over_tolerance": 0}, "Bit for bit", "Clearly different"),
    (2, 2, {"kv_diff_over_tolerance": 0.2}, "Equal up to rounding", "Clearly different"),
    (2, 2, {"kv_diff_over_tolerance": 40}, "Clearly different", "Equal up to rounding"),
    (2, 4, {"prefill_intensity": 115, "prefill_weights_intensity": 210}, "**115 FLOP/byte**", "reached"),
    (2, 4, {"prefill_intensity": 115, "prefill_weights_intensity": 210}, "it is **210 FLOP/byte**", ""),
    (2, 5, {"prefill_over_ridge": 0.4}, "still left of the ridge", "right of the ridge (3"),
    (2, 5, {"prefill_over_ridge": 6}, "right of the ridge", "still left of the ridge"),
    (2, 6, {"past_ridge_over_ridge": 0.6}, "stays left of", "right of the ridge, reached"),
    (2, 6, {"past_ridge_over_ridge": 2}, "right of the ridge, reached", "stays left of"),
    (1, 4, {"sparse_ttft_speedup": 0.24, "dense_ttft_s": 9.86, "sparse_ttft_s": 41.5},
     "**slower than dense** here: **0.24×**\n(9.86 s dense, 41.5 s block-sparse)", "faster than dense"),
    (1, 4, {"sparse_ttft_speedup": 1.4}, "**1.4× faster than dense** end to end", "slower than dense"),
    (1, 4, {"attention_share_of_ttft_percent": 25, "amdahl_cap": 1.25}, "attention was **25%**", ""),
    (1, 4, {"attention_share_of_ttft_percent": 25, "amdahl_cap": 1.25}, "= **1.25×**", ""),
    (1, 4, {"sparse_ttft_speedup": 1.4, "speedup_over_amdahl_cap": 0.5}, "0.5 of the cap, within it", "above it"),
    (1, 4, {"sparse_ttft_speedup": 1.4, "speedup_over_amdahl_cap": 1.1}, "1.1× the cap, above it", "within it"),
    (1, 4, {"sparse_ttft_speedup": 0.3, "sparse_attention_speedup": 0.1}, "skipping time", "of the cap"),
    (1, 4, {"sparse_ttft_speedup": 0.9, "sparse_attention_speedup": 1.2}, "although attention alone ran at\n1.2×",
     "skipping time"),
    (3, 2, {"positions_before_next_layer": 64, "num_tokens": 64, "kv_write_events": 30},
     "**30 KV write events** for its\n64 positions", "one position at a time"),
    (3, 2, {"positions_before_next_layer": 64, "first_layer_done_percent": 4.2}, "Layer by layer", "one position at"),
    (3, 2, {"positions_before_next_layer": 64, "first_layer_done_percent": 4.2}, "(4.2% of it)", ""),
    (3, 2, {"positions_before_next_layer": 1}, "one position at a time", "Layer by layer"),
    (3, 2, {"token_by_token_positions_before_next_layer": 1, "token_by_token_kv_write_events": 1920},
     "took **1,920 events**", "yet layer 0 wrote"),
    (3, 2, {"token_by_token_positions_before_next_layer": 4}, "yet layer 0 wrote\n4 positions", "took **"),
    (3, 3, {"kv_at_context_over_weights": 0.7}, "still less than the model's own weights", "already takes more"),
    (3, 3, {"kv_at_context_over_weights": 1.4}, "already takes more than the model's own weights", "still less"),
    (4, 1, {"outputs_identical": 1, "extra_steps_on": 7}, "7 more", "tokens differ"),
    (4, 1, {"outputs_identical": 0}, "tokens differ", "the same either way"),
    (4, 2, {"arrival_gap_ratio": 1.1}, "barely changed", "shortened it"),
    (4, 2, {"arrival_gap_ratio": 9}, "shortened it", "barely changed"),
    (4, 3, {"long_ttft_ratio": 0.8}, "got shorter", "It got longer"),
    (4, 3, {"long_ttft_ratio": 1.01}, "About the same", "It got longer"),
    (4, 3, {"long_ttft_ratio": 1.4}, "It got longer", "About the same"),
    (4, 4, {"later_cached_percent": 97, "hit_rate_percent": 65}, "97% of the second", ""),
    (4, 4, {"later_cached_percent": 97, "hit_rate_percent": 65}, "the first request included (it finds nothing", ""),
    (4, 4, {"later_cached_percent": 97, "hit_rate_percent": 65}, "is 65%", ""),
    (4, 5, {"ttft_speedup": 1.1}, "Only 1.1× faster", "to nearly nothing"),
    (4, 5, {"ttft_speedup": 8}, "8× faster: with a hit", "Only"),
    (4, 5, {"outputs_identical": 0}, "tokens differ", "the same either way"),
    (4, 6, {"num_students": 30, "first_ttft_ms": 21.5, "last_ttft_ms": 290, "last_over_first_ttft": 13.5,
            "steps_to_last_first_token": 33}, "after\n**290 ms**: 13.5× later, 33 engine steps", ""),
    (4, 6, {"steps_to_last_first_token": 1, "students_per_slot": 0.5, "num_students": 8, "max_num_running": 16},
     "One step gave every first token: the 8 requests fit the engine's\n16 running slots", "queued until"),
    (4, 6, {"steps_to_last_first_token": 5, "students_per_slot": 1, "num_prompt_steps": 5, "token_budget": 64},
     "token budget of 64: chunked prefill spread them over\n5 steps", "queued until"),
    (4, 6, {"steps_to_last_first_token": 33, "students_per_slot": 1.9, "num_waited": 14, "num_students": 30},
     "14 of the 30 prompts ran only in a later step", "One step gave"),
    (4, 6, {"students_per_slot": 1.9, "max_new_tokens": 32}, "(up to 32 tokens, one a step)", "chunked prefill"),
    (4, 6, {"cached_percent": 18.5}, "18.5% of the prompt tokens came from the prefix cache", "No prompt token"),
    (4, 6, {"cached_percent": 0}, "No prompt token came from the prefix cache", "were reused"),
    (5, 1, {"disagg_itl_growth": 1.3}, "stayed within 1.3×", "grew to"),
    (5, 1, {"disagg_itl_growth": 6}, "grew to 6×", "stayed within"),
    (5, 1, {"disagg_itl_growth": 1.3}, "chunking on 3 ms", "as with\nchunking"),
    (5, 2, {"kv_mb_sent_long": 11.8, "long_prompt_tokens": 512, "kv_bytes_per_token": 23040},
     "**11.8 MB** for 512 tokens in bfloat16 (23,040", "a few MB"),
    (5, 2, {"attention_share_percent": 7.7, "attention_crossover_tokens": 6143}, "near 6,143 tokens",
     "the longer the prompt, the cheaper"),
    (5, 3, {"placement_kind": 0}, "split its cores", "share one GPU"),
    (5, 3, {"placement_kind": 1}, "share one GPU", "split its cores"),
    (5, 3, {"placement_kind": 2}, "a GPU of its own", "split its cores"),
    (5, 3, {"placement_kind": 2, "disagg_ttft_ratio": 1.6}, "Longer here", "close to one engine's"),
    (5, 3, {"placement_kind": 2, "disagg_ttft_ratio": 1.0}, "About the same here", "Longer here"),
    (5, 3, {"disagg_ttft_ratio": 0.8}, "Shorter here", "About the same here"),
    (6, 1, {"piggyback_ratio": 1.5}, "the ratio is small", "ride along."),
    (6, 1, {"piggyback_ratio": 40}, "the decodes ride along", "the ratio is small"),
    (6, 1, {"mixed_over_prefill": 1.02}, "cost next to nothing here", "cost more here"),
    (6, 1, {"mixed_over_prefill": 1.5}, "cost more here", "next to nothing"),
    (6, 2, {"overhead_falls": 0}, "were not the slower ones", "two reasons"),
    (6, 2, {"overhead_falls": 1}, "two reasons", "were not the slower ones"),
    (6, 2, {"paper_512_min_percent": -0.5, "paper_512_max_percent": 18.9}, "-0.5% to 18.9% more", "about"),
    (6, 3, {"ridge_tokens": 9}, "This ridge is low", "This ridge is high"),
    (6, 3, {"ridge_tokens": 400}, "This ridge is high", "This ridge is low"),
    (6, 3, {"weights_read_share": 0.8}, "set by reading the weights", "launch and host overhead"),
    (6, 3, {"weights_read_share": 0.05}, "launch and host overhead", "set by reading the weights"),
    (6, 4, {"one_short_cached": 0}, "the rule vLLM follows too", "should not happen"),
    (6, 4, {"one_short_cached": 8}, "should not happen", "the rule vLLM follows too"),
    (6, 5, {"has_crossover": 1, "crossover_tokens": 256}, "from a prompt of 256 tokens", "did not beat"),
    (6, 5, {"has_crossover": 0}, "did not beat one engine", "Disaggregation's worst gap beat"),
    (6, 5, {"device": "cpu", "placement_kind": 0}, "split cpu's cores", "GPU of its own"),
    (6, 5, {"placement_kind": 2}, "a GPU of its own", "cores"),
]


@pytest.mark.parametrize("lesson, step, measured, has, lacks", AGREES)
def test_the_reveal_text_agrees_with_the_measured_outcome(lesson, step, measured, has, lacks):
    measured = dict(measured)
    device = measured.pop("device", DEVICE)
    text = text_of(lesson, step, device, **measured)
    assert has in text, text
    if lacks:
        assert lacks not in text, text


def test_every_step_whose_outcome_depends_on_the_device_has_both_outcomes_checked():
    checked = {(lesson, step) for lesson, step, *_ in AGREES}
    with_variants = {(lesson, step) for lesson, step in ALL_STEPS if bounds(LESSONS[lesson].steps[step - 1])}
    assert with_variants <= checked, with_variants - checked


def test_a_variant_is_chosen_by_the_first_condition_that_holds():
    kind = ACTION_KINDS["ttft_ratio"]
    text = "Shared {ttft_ratio}.\n\n#### If ttft_ratio < 2\nflat\n#### If ttft_ratio <= 16\nsome\n#### Otherwise\nsteep"
    _, variants = parse_after_reveal(text, kind, "here")
    assert [chosen_variant(variants, {"ttft_ratio": v}).text for v in (1.0, 2.0, 16.0, 16.5)] == [
        "flat", "some", "some", "steep"]
    assert math.isclose(variants[1].bound, 16)


@pytest.mark.parametrize(
    "text, message",
    [
        ("#### If speed < 2\na\n#### Otherwise\nb", "variant condition names 'speed'"),
        ("#### If ttft_ratio is big\na\n#### Otherwise\nb", "must read 'If name < number'"),
        ("#### If ttft_ratio < 2\na", "the last variant must be '#### Otherwise'"),
        ("It took {seconds}.", "placeholder {seconds} is not measured"),
    ],
)
def test_a_broken_reveal_text_says_what_is_wrong(text, message):
    with pytest.raises(LessonError, match=message.replace("(", r"\(").replace("{", r"\{")):
        parse_after_reveal(text, ACTION_KINDS["ttft_ratio"], "here")


@pytest.mark.parametrize(
    "devices, kind, words",
    [(("cpu", "cpu"), 0, "split its cores"), (("cuda:0", "cuda:0"), 1, "share one GPU"),
     (("cuda:0", "cuda:1"), 2, "a GPU of its own")],
)
def test_the_disaggregation_text_follows_where_the_workers_ran(devices, kind, words):
    from prefillviz.lessons.kinds.disagg import placement_kind

    assert placement_kind(devices) == kind
    assert words in text_of(5, 3, devices[0], placement_kind=kind)


def test_a_choice_and_the_text_after_it_split_the_outcomes_at_the_same_bounds():
    """Where the text's variants turn on the question's own answer, each variant is one choice (or a run of them):
    the revealed choice and the explanation can never disagree."""
    for lesson in LESSONS.values():
        for step in lesson.steps:
            question = step.question
            _, variants = parse_after_reveal(step.after_reveal, ACTION_KINDS[step.action["kind"]], "test")
            on_answer = [v for v in variants if v.name == question.answer]
            if question.kind != "choice" or not on_answer:
                continue
            bounds = {choice.up_to for choice in question.choices}
            for variant in on_answer:
                assert variant.op == "<=" and variant.bound in bounds, (lesson.slug, step.index + 1, variant)
