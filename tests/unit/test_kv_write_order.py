"""The order a run wrote its KV cache (figures/kv_write_order.py) and the lesson step that asks for it
(lessons/kinds/kv_write_order.py), on hand-made inspection traces with known clocks: one step writes a
layer's whole row before the next layer starts, token by token carries one position through every layer."""

import math

import numpy as np
import pytest

from prefillviz import lessons
from prefillviz.engine.scheduler import ScheduledChunk
from prefillviz.engine.trace import RequestRecord, StepRecord, Trace
from prefillviz.figures.kv_write_order import kv_write_order, write_order_figure
from prefillviz.instrument.records import KVWriteRecord, LayerTimes
from prefillviz.lessons.kinds.kv_write_order import order_numbers

NUM_LAYERS, NUM_TOKENS = 3, 4
LAYER_S = [0.010, 0.020, 0.030]  # each layer's measured span
LEAD_S = 0.003  # schedule + prepare + embedding: the first layer starts this long after the step
STEP_GAP_S = 0.100  # token by token: one step every 100 ms
WALL_S = 0.070


def step(index: int, positions: list[int], kv_log: bool = True) -> StepRecord:
    times = LayerTimes("perf_counter", [0.0] * NUM_LAYERS, [0.0] * NUM_LAYERS, [0.0] * NUM_LAYERS, list(LAYER_S),
                       embedding_s=0.001, final_norm_s=0.0, lm_head_s=0.0)
    writes = KVWriteRecord(np.array(positions), np.array(positions), np.array(positions) // 16,
                           list(range(NUM_LAYERS)), 0, np.zeros((NUM_LAYERS, len(positions), 1)),
                           np.zeros((NUM_LAYERS, len(positions), 1)))
    last = positions[-1] == NUM_TOKENS - 1
    return StepRecord(
        step_index=index, chunks=[ScheduledChunk("r", positions[0], len(positions), True, last)], blocks_hit={},
        blocks_allocated={}, blocks_evicted=[], preempted_request_ids=[], sampled_token_ids={"r": 7} if last else {},
        num_free_blocks=0, start_time_s=index * STEP_GAP_S, wall_time_s=WALL_S, schedule_time_s=0.001,
        prepare_time_s=0.001, forward_time_s=0.065, sample_time_s=0.001, update_time_s=0.0,
        capture_level="inspect" if kv_log else "timing", layer_times=times, kv_writes=writes if kv_log else None,
    )


def trace(budget: int, kv_log: bool = True) -> Trace:
    record = RequestRecord("r", list(range(NUM_TOKENS)), [7], "finished", 0, 0, 0.0, 0.0, 0.06, [])
    steps = [step(i, list(range(start, start + budget)), kv_log)
             for i, start in enumerate(range(0, NUM_TOKENS, budget))]
    return Trace("m", "cpu", "float32", {"block_size": 16, "token_budget": budget}, 4, 0, 0, steps, {"r": record})


def test_one_step_writes_each_layers_whole_row_before_the_next_layer():
    order = kv_write_order(trace(NUM_TOKENS))
    assert [(e.layer, e.positions) for e in order.events] == [(layer, (0, 1, 2, 3)) for layer in range(NUM_LAYERS)]
    # each event at the end of its layer's span: 3 ms in, then 10, 20 and 30 ms of layers
    assert [e.time_s for e in order.events] == pytest.approx([0.013, 0.033, 0.063])
    assert (order.num_layers, order.num_positions, order.run_s) == (NUM_LAYERS, NUM_TOKENS, WALL_S)
    assert order.positions_before(1) == NUM_TOKENS and order.layer_done_s(0) == pytest.approx(0.013)
    written = order.written_at_s()
    assert written.shape == (NUM_LAYERS, NUM_TOKENS) and np.allclose(written, [[0.013] * 4, [0.033] * 4, [0.063] * 4])


def test_token_by_token_carries_one_position_through_every_layer_first():
    order = kv_write_order(trace(1))
    assert order.num_events == NUM_LAYERS * NUM_TOKENS
    assert [(e.layer, e.positions) for e in order.events[:4]] == [(0, (0,)), (1, (0,)), (2, (0,)), (0, (1,))]
    assert order.positions_before(1) == 1
    assert order.layer_done_s(0) == pytest.approx(3 * STEP_GAP_S + 0.013)  # layer 0's last cell: the last step's
    assert order.run_s == pytest.approx(3 * STEP_GAP_S + WALL_S)
    assert np.allclose(order.written_at_s()[:, 2], [0.213, 0.233, 0.263])  # position 2: the third step, every layer


def test_the_steps_numbers_come_from_the_events():
    assert order_numbers(kv_write_order(trace(NUM_TOKENS))) == pytest.approx({
        "kv_write_events": 3, "positions_before_next_layer": 4, "first_layer_done_ms": 13, "run_ms": 70,
        "first_layer_done_percent": 100 * 13 / 70,
    })
    by_token = order_numbers(kv_write_order(trace(1)), "token_by_token_")
    assert by_token["token_by_token_kv_write_events"] == 12
    assert by_token["token_by_token_positions_before_next_layer"] == 1
    assert by_token["token_by_token_first_layer_done_ms"] == pytest.approx(313)


def test_a_timing_pass_has_no_write_events_to_order():
    with pytest.raises(ValueError, match="not an inspection pass"):
        kv_write_order(trace(NUM_TOKENS, kv_log=False))


def test_the_figure_colours_rows_in_one_step_and_columns_token_by_token():
    figure = write_order_figure([("one step", kv_write_order(trace(NUM_TOKENS))),
                                 ("token by token", kv_write_order(trace(1)))])
    one_step, by_token = (np.array(heatmap.z) for heatmap in figure.data)
    assert np.allclose(one_step, one_step[:, :1])  # every row one colour: a layer's cells at once
    run_s = 3 * STEP_GAP_S + WALL_S
    assert np.allclose(by_token[:, 1:] - by_token[:, :-1], 100 * STEP_GAP_S / run_s)  # a column a step later
    assert figure.layout.annotations[1].text == "token by token: 12 write events"


def test_the_choice_and_the_text_after_it_follow_the_recorded_order():
    step = next(s for lesson in lessons.load_lessons() for s in lesson.steps if s.action["kind"] == "kv_write_order")
    kind = lessons.ACTION_KINDS["kv_write_order"]
    measured = {"num_tokens": 4, "num_layers": 3, **order_numbers(kv_write_order(trace(NUM_TOKENS))),
                **order_numbers(kv_write_order(trace(1)), "token_by_token_")}
    assert set(measured) == set(kind.measured) and all(math.isfinite(v) for v in measured.values())
    outcome = lessons.ActionOutcome("kv_write_order", {}, measured, [], {}, "m", "cpu", "float32")
    picked = step.question.choices[lessons.choice_for(step.question, measured["positions_before_next_layer"])]
    assert picked.label.startswith("All positions of layer 0")
    text = lessons.step_after_reveal(step, outcome)
    assert "**3 KV write events** for its\n4 positions" in text and "Layer by layer" in text
    assert "complete 13 ms into the 70 ms step\n(18.6% of it)" in text
    assert "took **12 events**" in text and "one position at a time" not in text
