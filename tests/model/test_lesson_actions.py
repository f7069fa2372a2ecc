"""Every lesson action kind on the bundled model (fp32), at a small scale: it runs, returns
every number its questions ask for, and the numbers say what the lessons say they show."""

import math

import pytest

from prefillviz import lessons
from prefillviz.experiments.prefill import PrefillResult
from prefillviz.loading.prompts import PRESETS

SCALE = 0.05  # token counts x 0.05 (each kind has a floor): seconds per action, not minutes
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def first_action(kind: str) -> dict:
    """The first action of this kind in the lesson files (what a class really runs)."""
    return next(
        step.action for lesson in lessons.load_lessons() for step in lesson.steps if step.action["kind"] == kind
    )


def run(bundled, kind: str, **override) -> lessons.ActionOutcome:
    # None: the default
    action = {name: value for name, value in {**first_action(kind), **override}.items() if value is not None}
    outcome = lessons.run_action(bundled, action, scale=SCALE)
    assert set(outcome.measured) == set(lessons.ACTION_KINDS[kind].measured)
    assert all(math.isfinite(value) for value in outcome.measured.values()), outcome.measured
    assert (outcome.model_id, outcome.dtype) == (bundled.model_id, "float32") and outcome.elapsed_s > 0
    for lesson in lessons.load_lessons():  # every question on this kind gets a reveal and a figure
        for step in lesson.steps:
            if step.action["kind"] == kind:
                reveal = lessons.format_reveal(
                    step.question, outcome.measured[step.question.answer],
                    0 if step.question.kind == "choice" else step.question.default,
                )
                assert reveal.measured_text and reveal.verdict
                assert lessons.step_figure(step, outcome).data
    return outcome


def test_a_budget_smaller_than_the_prompt_takes_several_steps(bundled):
    outcome = run(bundled, "prefill")  # lesson 1, step 1: a budget smaller than the prompt
    measured = outcome.measured
    budget = measured["token_budget"]
    assert budget < measured["num_tokens"] and measured["num_steps"] == math.ceil(measured["num_tokens"] / budget)
    assert 2 <= measured["num_steps"] <= 9  # the lesson's answer: "A few steps"
    assert lessons.page_results(outcome, "") == {}  # the Prefill page draws one pass: not this run


def test_prefill_is_one_step_and_sets_the_prefill_page(bundled):
    outcome = run(bundled, "prefill", token_budget=None)
    measured = outcome.measured
    assert measured["num_steps"] == 1 and (
        measured["num_tokens"] == len(bundled.tokenizer(PRESETS["Chat with a system prompt"])["input_ids"])
    )
    assert 0 < measured["forward_share_percent"] <= 100 and measured["forward_ms"] <= measured["ttft_ms"]
    results = lessons.page_results(outcome, "label")
    assert isinstance(results["prefill"], PrefillResult) and (
        results["prefill"].prompt == PRESETS["Chat with a system prompt"]
    )
    assert lessons.page_state(outcome) == {
        "prefill_prompt": PRESETS["Chat with a system prompt"], "prefill_preset": "Chat with a system prompt"
    }


def test_ttft_ratio_times_a_short_and_a_long_prompt(bundled):
    outcome = run(bundled, "ttft_ratio", runs=3)
    measured, times = outcome.measured, outcome.raw["times"]
    assert (measured["short_tokens"], measured["long_tokens"]) == (4, 26)
    assert [len(times[4]), len(times[26])] == [3, 3]  # each shape's warm-up run is left out
    assert sum(times[4]) + sum(times[26]) < outcome.elapsed_s  # real clocks inside the action's own wall time
    facts = dict(outcome.facts)  # what the step shows: both times, and their ratio agreeing with them
    assert set(facts) == {
        "TTFT, 4 tokens", "TTFT, 26 tokens", "Tokens: long / short", "TTFT: long / short",
        "FLOPs: long / short (time ∝ FLOPs would give this)",
    }
    assert measured["ttft_over_flop_ratio"] == pytest.approx(measured["ttft_ratio"] / measured["flop_ttft_ratio"])
    assert 6 < measured["flop_ttft_ratio"] < 26 / 4 + 1 and 6_000 < measured["attention_crossover_tokens"] < 6_300
    shown = [float(facts[f"TTFT, {n} tokens"].removesuffix(" ms").replace(",", "")) for n in (4, 26)]
    assert float(facts["TTFT: long / short"].removesuffix("×")) == pytest.approx(shown[1] / shown[0], abs=0.06)


def test_token_by_token_takes_n_steps_is_slower_and_fills_the_same_cache(bundled):
    outcome = run(bundled, "parallel_vs_sequential", num_tokens=320, parallel_timing_runs=1)  # x 0.05 = 16 tokens
    measured = outcome.measured
    assert measured["num_tokens"] == measured["token_by_token_steps"] == 16
    assert measured["ratio"] > 1  # 16 steps that each read every weight vs 1
    assert measured["same_top_token"] == 1 and measured["kv_diff_over_tolerance"] < 1
    assert measured["kv_relative_diff"] < measured["relative_tolerance"] and 0 < measured["flop_extra_percent"] < 100
    assert lessons.page_results(outcome, "")["parallel"] is outcome.raw["parallel"]


def test_roofline_puts_prefill_at_a_higher_intensity_than_decode(bundled):
    measured = run(bundled, "roofline", runs=1).measured
    assert measured["prefill_tokens"] == 13 and measured["intensity_ratio"] > 5
    # 2 FLOPs per weight
    assert measured["decode_intensity"] == pytest.approx(measured["decode_intensity_limit"], rel=0.05)
    assert measured["decode_intensity_limit"] == 0.5  # fp32: 4 bytes per weight
    assert measured["past_ridge_tokens"] >= 13 and (
        measured["past_ridge_over_ridge"] >= 1.5 or measured["past_ridge_tokens"] > 13
    )
    assert measured["prefill_gflops"] > 0 and measured["decode_gflops"] > 0 and measured["ridge_intensity"] > 0


def test_kv_memory_matches_the_formula_and_gqa_saves_3x(bundled):
    measured = run(bundled, "kv_memory").measured
    assert measured["kv_bytes_per_token"] == measured["kv_bytes_per_token_formula"] == 2 * 30 * 3 * 64 * 4
    assert measured["gqa_saving_factor"] == 3 and measured["mha_bytes_per_token"] == 138_240
    assert measured["num_blocks"] == math.ceil(measured["num_tokens"] / measured["block_size"])
    assert measured["kv_total_mb"] == pytest.approx(measured["num_tokens"] * 46_080 / 1e6)
    # at the model's whole context one request's cache (~377 MB) is still smaller than the weights (~538 MB)
    assert measured["max_context"] == 8192 and measured["kv_at_context_mb"] == pytest.approx(8192 * 46_080 / 1e6)
    assert measured["weights_mb"] == pytest.approx(538, rel=0.01) and (
        measured["kv_at_context_mb"] < measured["weights_mb"]
    )
    assert measured["tokens_to_match_weights"] == math.ceil(measured["weights_mb"] * 1e6 / 46_080)


def test_chunked_runs_more_steps_and_generates_the_same_tokens(bundled):
    outcome = run(bundled, "chunked")
    assert outcome.measured["outputs_identical"] == 1 and (
        outcome.measured["num_steps_on"] > outcome.measured["num_steps_off"]
    )
    assert outcome.measured["arrival_gap_ratio"] == pytest.approx(
        outcome.measured["arrival_gap_off_ms"] / outcome.measured["arrival_gap_on_ms"]
    )
    assert set(lessons.page_results(outcome, "label")["chunked"]) == {"comparison", "label"}


def test_prefix_cache_hits_the_shared_prefix_and_keeps_the_outputs(bundled):
    outcome = run(bundled, "prefix")
    measured = outcome.measured
    assert measured["num_shared_prefix_tokens"] >= 40 and measured["outputs_identical"] == 1
    assert measured["later_cached_percent"] > 0 and measured["hit_rate_percent"] > 0  # every full prefix block is a hit
    assert set(lessons.page_results(outcome, "label")["prefix"]) == {"experiment", "label"}


def test_disagg_sends_the_long_prompts_kv_and_says_where_the_workers_ran(bundled):
    outcome = run(bundled, "disagg")
    measured = outcome.measured
    assert measured["placement_kind"] == 0  # both workers on this CPU: the lesson's text says they split its cores
    assert measured["kv_mb_sent_long"] == pytest.approx(
        measured["long_prompt_tokens"] * measured["kv_bytes_per_token"] / 1e6
    )
    assert measured["kv_bytes_per_token"] == 46_080 and measured["outputs_identical"] == 1
    assert measured["disagg_ttft_ratio"] == pytest.approx(
        measured["long_ttft_disagg_ms"] / measured["long_ttft_off_ms"]
    )
    assert "cpu" in dict(outcome.facts)["Placement"]


def test_kv_write_order_reads_the_replays_events_layer_by_layer_against_token_by_token(bundled):
    outcome = run(bundled, "kv_write_order")  # 64 tokens x 0.05: the floor of 8
    measured, layers = outcome.measured, bundled.info.num_layers
    assert measured["num_tokens"] == 8 and measured["num_layers"] == layers
    assert measured["kv_write_events"] == layers and measured["positions_before_next_layer"] == 8  # layer by layer
    assert measured["token_by_token_kv_write_events"] == layers * 8
    assert measured["token_by_token_positions_before_next_layer"] == 1  # one position through every layer first
    assert 0 < measured["first_layer_done_ms"] < measured["run_ms"]
    assert measured["token_by_token_first_layer_done_percent"] > 80  # layer 0's last cell: in the last step
    watch = lessons.page_results(outcome, "")["watch"]  # what the Watch it happen page plays: this same run
    prefill_lanes = watch["payload"]["scenes"][0]["lanes"]
    assert [len(lane["frames"]["kind"]) for lane in prefill_lanes] == [
        1 + layers + 1, 8 * (1 + layers) + 1]  # steps, KV write events, the sampled token


def test_sparse_speedup_times_dense_and_block_sparse_and_states_amdahls_cap(bundled):
    outcome = run(bundled, "sparse_speedup")  # 4,096 tokens x 0.05: the floor of 512, four 128-token blocks
    measured = outcome.measured
    assert measured["num_tokens"] == 512 and measured["key_blocks_skipped_percent"] == pytest.approx(80)
    assert 0 < measured["attention_flops_skipped_percent"] < 80  # the first block and the diagonal are always kept
    assert measured["sparse_ttft_speedup"] == pytest.approx(measured["dense_ttft_s"] / measured["sparse_ttft_s"])
    share = measured["attention_share_of_ttft_percent"] / 100
    assert 0 < share < 1 and measured["amdahl_cap"] == pytest.approx(
        1 / (1 - share * measured["attention_flops_skipped_percent"] / 100))
    assert 1 < measured["amdahl_cap"] < measured["amdahl_cap_no_attention"]
    (comparison,) = lessons.page_results(outcome, "")["long_trade"]  # the Long prompts page's trade-off table
    assert comparison.num_tokens == 512 and comparison.runs == 1


def test_class_burst_lets_the_second_wave_in_when_the_first_answers_end(bundled):
    outcome = run(bundled, "class_burst")  # 30 students x 0.05: the floor of 4, with 2 running slots and 3 new tokens
    measured, burst = outcome.measured, outcome.raw["class_burst"]
    assert (measured["num_students"], measured["max_num_running"], measured["max_new_tokens"]) == (4, 2, 3)
    # first come, first served: students 1 and 2 run in step 0; 3 and 4 once their 3-token answers have ended
    assert [r.first_scheduled_step for r in burst.requests] == [0, 0, 3, 3]
    assert [r.first_token_step for r in burst.requests] == [0, 0, 3, 3]
    assert measured["steps_to_last_first_token"] == 4 and measured["num_waited"] == 2
    assert measured["max_prompts_per_step"] == 2 and measured["num_prompt_steps"] == 2
    assert measured["last_ttft_ms"] > measured["first_ttft_ms"] > 0
    assert measured["last_over_first_ttft"] == pytest.approx(measured["last_ttft_ms"] / measured["first_ttft_ms"])
    # the chat template's shared system turn: a full block the first wave computed, found by the second
    assert [r.num_cached_tokens for r in burst.requests][:2] == [0, 0] and measured["cached_percent"] > 0
    assert all(r.num_cached_tokens % 16 == 0 for r in burst.requests)
