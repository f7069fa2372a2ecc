"""The lesson step on a class's burst of Sends (lessons/kinds/class_burst.py) from a made-up run, no model: a trace's
steps become each student's first step and first-token step exactly, the numbers are the burst's, the engine is
the one `prefillviz serve` starts with, and the text after the reveal says why the last student waited."""

import types

import pytest
import torch

from prefillviz import lessons
from prefillviz.cli_parser import build_parser
from prefillviz.engine.config import EngineConfig
from prefillviz.experiments import class_burst
from prefillviz.experiments.served_engine import served_engine_config
from prefillviz.lessons.kinds import class_burst as kind

STEP = next(s for lesson in lessons.load_lessons() for s in lesson.steps if s.action["kind"] == "class_burst")


def chunk(request_id: str, num_tokens: int, is_prefill: bool):
    return types.SimpleNamespace(request_id=request_id, num_tokens=num_tokens, is_prefill=is_prefill)


def two_wave_trace():
    """3 students, 2 running slots, 2 new tokens each: s1 and s2 prefill in step 0 and decode in step 1, which ends
    their answers; s3 joins in step 2 and is answered in step 3. s3 hits 16 cached tokens."""
    steps = [
        ([chunk("student-1", 40, True), chunk("student-2", 36, True)], {"student-1": 5, "student-2": 6}, 0.020),
        ([chunk("student-1", 1, False), chunk("student-2", 1, False)], {"student-1": 7, "student-2": 8}, 0.010),
        ([chunk("student-3", 22, True)], {"student-3": 9}, 0.012),
        ([chunk("student-3", 1, False)], {"student-3": 2}, 0.010),
    ]
    requests = {
        "student-1": (40, 0, 0.020), "student-2": (36, 0, 0.021), "student-3": (38, 16, 0.043),
    }
    return types.SimpleNamespace(
        model_id="m", device="cpu", dtype="float32",
        steps=[types.SimpleNamespace(chunks=c, sampled_token_ids=s, wall_time_s=w) for c, s, w in steps],
        requests={rid: types.SimpleNamespace(num_prompt_tokens=n, num_cached_tokens=cached, time_to_first_token_s=t)
                  for rid, (n, cached, t) in requests.items()},
    )


def burst() -> class_burst.ClassBurst:
    ids = [class_burst.student_request_id(i) for i in range(3)]
    return class_burst.burst_of(two_wave_trace(), ids, token_budget=2048, max_num_running=2, max_new_tokens=2)


def test_a_trace_gives_each_student_its_first_step_and_its_first_token_step():
    result = burst()
    assert [(r.first_scheduled_step, r.first_token_step) for r in result.requests] == [(0, 0), (0, 0), (2, 2)]
    assert [(s.num_prompts, s.num_decodes, s.num_first_tokens) for s in result.steps] == [
        (2, 0, 2), (0, 2, 0), (1, 0, 1), (0, 1, 0)]
    assert result.steps_to_last_first_token == 3 and result.num_waited == 1 and result.max_prompts_per_step == 2
    assert result.first_ttft_s == 0.020 and result.last_ttft_s == 0.043
    assert result.cached_fraction == pytest.approx(16 / 114)
    assert kind.prompts_per_step_text(result) == "2 in step 0, 1 in step 2"


def run(monkeypatch, result: class_burst.ClassBurst, **action) -> lessons.ActionOutcome:
    asked = {}

    def fake_run(loaded, num_students, max_new_tokens, max_num_running, progress):
        asked.update(num_students=num_students, max_new_tokens=max_new_tokens, max_num_running=max_num_running)
        return result

    monkeypatch.setattr(kind.class_burst, "run_class_burst", fake_run)
    loaded = types.SimpleNamespace(model_id="m", device=torch.device("cpu"), dtype=torch.float32)
    outcome = lessons.run_action(loaded, {**STEP.action, **action})
    outcome.asked = asked
    return outcome


def test_the_lesson_asks_for_thirty_students_on_the_servers_engine(monkeypatch):
    outcome = run(monkeypatch, burst())
    assert outcome.asked == {"num_students": 30, "max_new_tokens": class_burst.STUDENT_MAX_NEW_TOKENS,
                             "max_num_running": EngineConfig().max_num_running}
    small = lessons.resolve_parameters(STEP.action, scale=0.05)[1]  # the tests' scale: still two waves
    assert small["num_students"] > small["max_num_running"] >= 2


def test_the_burst_engine_is_the_one_serve_starts_with():
    args = build_parser().parse_args(["serve"])
    config = served_engine_config()
    assert (args.token_budget, args.max_num_seqs, args.block_size, not args.no_prefix_cache) == (
        config.token_budget, config.max_num_running, config.block_size, config.enable_prefix_caching)
    assert config == EngineConfig()  # off hosted mode: no request limits either


def test_a_second_wave_is_revealed_as_waiting_for_the_first_ones_answers(monkeypatch):
    outcome = run(monkeypatch, burst())
    assert set(outcome.measured) == set(lessons.ACTION_KINDS["class_burst"].measured)
    assert outcome.measured == pytest.approx({
        "num_students": 3, "max_num_running": 2, "students_per_slot": 1.5, "token_budget": 2048,
        "max_new_tokens": 2, "mean_prompt_tokens": 38, "first_ttft_ms": 20, "median_ttft_ms": 21,
        "last_ttft_ms": 43, "last_over_first_ttft": 2.15, "steps_to_last_first_token": 3, "max_prompts_per_step": 2,
        "num_prompt_steps": 2, "num_waited": 1, "cached_percent": 100 * 16 / 114,
    })
    question = STEP.question
    assert question.choices[lessons.choice_for(question, 2.15)].label == "A few times later (up to 4×)"
    text = lessons.step_after_reveal(STEP, outcome)
    assert "the last student's after\n**43 ms**: 2.15× later, 3 engine steps" in text
    assert "1 of the 3 prompts ran only in a later step" in text and "(up to 2 tokens, one a step)" in text
    assert "14% of the prompt tokens came from the prefix cache" in text
    assert "One step gave" not in text and "chunked prefill spread" not in text
    figure = lessons.step_figure(STEP, outcome)
    ttft_bars = [trace for trace in figure.data if trace.name.startswith("first token in step")]
    assert [(trace.name, list(trace.x), list(trace.y)) for trace in ttft_bars] == [
        ("first token in step 0", [1, 2], [20.0, 21.0]), ("first token in step 2", [3], [43.0])]
    prompts = next(trace for trace in figure.data if trace.name.startswith("prompts"))
    assert list(prompts.y) == [2, 0, 1, 0]  # how many prompts shared each step


def test_one_step_for_everyone_is_revealed_as_one_step(monkeypatch):
    one = class_burst.ClassBurst(
        "m", "cpu", "float32", 2048, 16, 32,
        tuple(class_burst.StudentRequest(i, f"student-{i + 1}", 36, 0, 0.05, 0, 0) for i in range(4)),
        (class_burst.BurstStep(0, 4, 144, 0, 4, 0.05), class_burst.BurstStep(1, 0, 0, 4, 0, 0.01)), 1.0)
    text = lessons.step_after_reveal(STEP, run(monkeypatch, one))
    assert "One step gave every first token: the 4 requests fit the engine's\n16 running slots" in text
    assert "No prompt token came from the prefix cache" in text and "ran only in a later step" not in text
