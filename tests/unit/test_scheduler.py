"""Scheduler: token budget splits, decode-first order, chunking on/off, prefix hits,
preemption. No model: the tests play the runner by handing ``update`` sampled tokens."""

import pytest

from prefillviz.engine.block_pool import BlockPool
from prefillviz.engine.config import EngineConfig
from prefillviz.engine.errors import ConfigError
from prefillviz.engine.request import Request, RequestStatus, SamplingParams
from prefillviz.engine.scheduler import Scheduler


def make_scheduler(num_blocks=64, **config):
    config = EngineConfig(block_size=4, num_blocks=num_blocks, **config)
    return Scheduler(config, BlockPool(num_blocks, enable_caching=config.enable_prefix_caching))


def make_request(request_id, num_prompt_tokens, max_new_tokens=4, first_token=100):
    return Request(
        request_id,
        list(range(first_token, first_token + num_prompt_tokens)),
        SamplingParams(max_new_tokens=max_new_tokens),
    )


def run_step(scheduler, token=7):
    output = scheduler.schedule()
    sampled = {c.request_id: token for c in output.chunks if c.will_sample}
    scheduler.update(output, sampled, now=0.0)
    return output


def split(output):
    return [(c.request_id, c.num_tokens, "prefill" if c.is_prefill else "decode") for c in output.chunks]


def test_whole_prompt_in_one_step_when_it_fits():
    scheduler = make_scheduler(token_budget=64)
    scheduler.add_request(make_request("a", 10))
    output = run_step(scheduler)
    assert split(output) == [("a", 10, "prefill")]
    assert output.chunks[0].will_sample
    assert output.blocks_allocated == {"a": [0, 1, 2]}
    request = scheduler.requests["a"]
    assert request.num_computed_tokens == 10 and request.output_token_ids == [7]
    assert len(request.block_hashes) == 2  # two full blocks of 4, the third is partial


def test_token_budget_one_is_token_by_token():
    scheduler = make_scheduler(token_budget=1)
    request = make_request("a", 5, max_new_tokens=1)
    scheduler.add_request(request)
    outputs = [run_step(scheduler) for _ in range(5)]
    assert [split(o) for o in outputs] == [[("a", 1, "prefill")]] * 5
    assert [o.chunks[0].will_sample for o in outputs] == [False] * 4 + [True]
    assert request.status is RequestStatus.FINISHED_LENGTH
    assert not scheduler.has_unfinished_requests()


def test_decodes_go_first_and_the_prefill_is_chunked_into_what_is_left():
    scheduler = make_scheduler(token_budget=8)
    scheduler.add_request(make_request("a", 3, max_new_tokens=10))
    scheduler.add_request(make_request("b", 3, max_new_tokens=10))
    assert split(run_step(scheduler)) == [("a", 3, "prefill"), ("b", 3, "prefill")]
    scheduler.add_request(make_request("long", 20))
    assert split(run_step(scheduler)) == [("a", 1, "decode"), ("b", 1, "decode"), ("long", 6, "prefill")]
    # the partly prefilled request is running now, but decodes still come first
    assert split(run_step(scheduler)) == [("a", 1, "decode"), ("b", 1, "decode"), ("long", 6, "prefill")]
    assert split(run_step(scheduler)) == [("a", 1, "decode"), ("b", 1, "decode"), ("long", 6, "prefill")]
    output = run_step(scheduler)
    assert split(output) == [("a", 1, "decode"), ("b", 1, "decode"), ("long", 2, "prefill")]
    assert output.chunks[2].will_sample and scheduler.requests["long"].num_computed_tokens == 20


def test_chunking_off_runs_whole_prompts_and_pauses_decodes():
    scheduler = make_scheduler(token_budget=8, enable_chunked_prefill=False)
    scheduler.add_request(make_request("a", 3, max_new_tokens=10))
    run_step(scheduler)
    scheduler.add_request(make_request("long", 20))
    assert split(run_step(scheduler)) == [("long", 20, "prefill")]  # longer than the budget, whole
    assert split(run_step(scheduler)) == [("a", 1, "decode"), ("long", 1, "decode")]


def test_chunking_off_admits_a_second_prompt_only_within_the_budget():
    scheduler = make_scheduler(token_budget=8, enable_chunked_prefill=False)
    for name, n in [("a", 5), ("b", 3), ("c", 2)]:
        scheduler.add_request(make_request(name, n))
    assert split(run_step(scheduler)) == [("a", 5, "prefill"), ("b", 3, "prefill")]
    assert split(run_step(scheduler)) == [("c", 2, "prefill")]


def test_max_num_running_limits_admission():
    scheduler = make_scheduler(token_budget=64, max_num_running=2)
    for name in "abc":
        scheduler.add_request(make_request(name, 2, max_new_tokens=5))
    assert [c.request_id for c in run_step(scheduler).chunks] == ["a", "b"]
    assert [c.request_id for c in run_step(scheduler).chunks] == ["a", "b"]


def test_prefix_hit_starts_after_the_cached_blocks_and_counts_tokens():
    scheduler = make_scheduler(token_budget=64)
    scheduler.add_request(make_request("first", 10, max_new_tokens=1))
    run_step(scheduler)  # finishes; its 2 full blocks stay cached in the free queue
    request = make_request("second", 11, max_new_tokens=1)
    scheduler.add_request(request)
    output = run_step(scheduler)
    assert output.blocks_hit == {"second": [0, 1]}
    assert split(output) == [("second", 3, "prefill")]
    assert output.chunks[0].start_position == 8
    assert request.num_cached_tokens == 8
    assert (scheduler.prefix_cache_queries, scheduler.prefix_cache_hits) == (10 + 11, 8)


def test_a_fully_cached_prompt_still_computes_its_last_token():
    scheduler = make_scheduler(token_budget=64)
    scheduler.add_request(make_request("first", 8, max_new_tokens=1))
    run_step(scheduler)
    scheduler.add_request(make_request("again", 8, max_new_tokens=1))
    output = run_step(scheduler)
    assert output.blocks_hit == {"again": [0]}  # block 2 holds the last token: not a hit
    assert split(output) == [("again", 4, "prefill")]


def test_prefix_caching_off_never_hits():
    scheduler = make_scheduler(token_budget=64, enable_prefix_caching=False)
    scheduler.add_request(make_request("first", 10, max_new_tokens=1))
    run_step(scheduler)
    scheduler.add_request(make_request("second", 10, max_new_tokens=1))
    assert run_step(scheduler).blocks_hit == {}
    assert scheduler.prefix_cache_hits == 0


def test_shared_blocks_are_ref_counted_across_running_requests():
    scheduler = make_scheduler(token_budget=64)
    scheduler.add_request(make_request("a", 9, max_new_tokens=3))
    run_step(scheduler)
    scheduler.add_request(make_request("b", 9, max_new_tokens=3))
    run_step(scheduler)
    a, b = scheduler.requests["a"], scheduler.requests["b"]
    assert a.block_table[:2] == b.block_table[:2]
    assert [scheduler.block_pool.blocks[i].ref_cnt for i in a.block_table[:2]] == [2, 2]


def test_when_blocks_run_out_the_last_running_request_is_preempted_and_recomputed():
    scheduler = make_scheduler(num_blocks=4, token_budget=64, enable_prefix_caching=False)
    a = make_request("a", 4, max_new_tokens=4)  # needs a 2nd block at its first decode
    scheduler.add_request(a)
    scheduler.add_request(make_request("b", 8, max_new_tokens=4, first_token=200))
    assert split(run_step(scheduler)) == [("a", 4, "prefill"), ("b", 8, "prefill")]  # 1 + 2 blocks
    output = run_step(scheduler)  # a and b both need a new block; only 1 is free
    assert output.preempted_request_ids == ["b"]
    assert split(output) == [("a", 1, "decode")]
    b = scheduler.requests["b"]
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.block_table == []
    assert b.output_token_ids == [7]  # kept: recomputed later, never dropped
    assert scheduler.waiting[0] is b
    while scheduler.has_unfinished_requests():
        run_step(scheduler)
    assert a.output_token_ids == [7] * 4
    assert b.output_token_ids == [7] * 4 and b.num_preemptions == 1


def test_finished_request_frees_its_blocks_tail_first():
    scheduler = make_scheduler(num_blocks=8, token_budget=64)
    request = make_request("a", 12, max_new_tokens=1)
    scheduler.add_request(request)
    run_step(scheduler)
    assert request.block_table == []
    assert list(scheduler.block_pool.free_queue)[-3:] == [2, 1, 0]


def test_finished_requests_leave_the_scheduler():
    """A reused scheduler holds only the requests still running or waiting, however many it served."""
    scheduler = make_scheduler(num_blocks=8, token_budget=64)
    for i in range(5):
        request = make_request(f"r{i}", 6, max_new_tokens=2)
        scheduler.add_request(request)
        run_step(scheduler)
        assert list(scheduler.requests) == [f"r{i}"]
        run_step(scheduler)  # its second token: finished
        assert scheduler.requests == {} and request.output_token_ids == [7, 7]
    kept, aborted = make_request("kept", 6), make_request("aborted", 6)
    scheduler.add_request(kept)
    scheduler.add_request(aborted)
    run_step(scheduler)
    scheduler.finish_request(aborted, RequestStatus.FINISHED_ABORTED, now=0.0)  # an abort lets it go too
    assert list(scheduler.requests) == ["kept"]


@pytest.mark.parametrize("field", ["block_size", "token_budget", "max_num_running", "num_blocks", "max_prompt_tokens",
                                   "max_new_tokens"])
@pytest.mark.parametrize("value", [0, -3])
def test_impossible_settings_are_refused(field, value):
    with pytest.raises(ConfigError, match=field):
        EngineConfig(**{field: value})
