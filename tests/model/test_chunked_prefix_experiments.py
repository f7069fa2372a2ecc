"""The chunked-prefill and prefix-cache experiments on real model runs (tiny random Llama,
then the bundled model with small sizes), and the figures built from them."""

import json
import math
import random

import pytest

from prefillviz.engine.errors import ConfigError, RequestError
from prefillviz.experiments import budget_sweep, chunked, prefix
from prefillviz.experiments.outputs import compare_outputs
from prefillviz.figures import chunked as chunked_figures
from prefillviz.figures import prefix as prefix_figures


def random_ids(n, seed, vocab=128):
    rng = random.Random(seed)
    return tuple(rng.randrange(vocab) for _ in range(n))


def tiny_workload(**changes):
    settings = dict(
        short_prompts=(random_ids(9, 1), random_ids(13, 2), random_ids(11, 3)),
        short_max_new_tokens=8,
        long_prompt=random_ids(60, 4),
        long_max_new_tokens=3,
        arrival_step=2,
        token_budget=16,
        block_size=4,
    )
    settings.update(changes)
    return chunked.ChunkedWorkload(**settings)


def decoding_ids_at(trace, step_index):
    """Requests that had sampled a token before this step and still had tokens to go."""
    sampled = {rid: 0 for rid in trace.requests}
    for step in trace.steps[:step_index]:
        for rid in step.sampled_token_ids:
            sampled[rid] += 1
    return {rid for rid, n in sampled.items() if 0 < n < len(trace.requests[rid].output_token_ids)}


def check_chunking(comparison):
    workload, off, on = comparison.workload, comparison.off, comparison.on
    # the schedule never changes what is generated
    assert [c.request_id for c in comparison.output_checks] == workload.request_ids
    assert all(c.identical for c in comparison.output_checks)
    for trace in (off, on):
        assert [len(trace.requests[rid].output_token_ids) for rid in workload.request_ids] == [
            workload.short_max_new_tokens
        ] * len(workload.short_prompts) + [workload.long_max_new_tokens]

    # chunking on: every step after the long prompt arrives carries every decoding request
    after = chunked.steps_after_arrival(on)
    assert after and after[0].step_index == workload.arrival_step
    for step in after:
        assert decoding_ids_at(on, step.step_index) <= {c.request_id for c in step.chunks}
        assert step.num_scheduled_tokens <= workload.token_budget
    assert chunked.paused_decode_steps(on) == [] and comparison.summary_on.num_paused_decode_steps == 0
    # ... and the long prompt is cut into chunks that sum to its length and fit the budget left
    long_chunks = [
        (s, c) for s in on.steps for c in s.chunks if c.request_id == chunked.LONG_REQUEST_ID and c.is_prefill
    ]
    assert sum(c.num_tokens for _, c in long_chunks) == len(workload.long_prompt)
    assert len(long_chunks) > 1
    for step, chunk in long_chunks:
        assert chunk.num_tokens <= workload.token_budget - step.num_decode_tokens
    assert [c.start_position for _, c in long_chunks] == (
        [0] + list(itertools_accumulate(c.num_tokens for _, c in long_chunks))[:-1]
    )

    # chunking off: one prefill-only step runs the whole long prompt while the others wait
    whole = [s for s in off.steps if any(c.request_id == chunked.LONG_REQUEST_ID and c.is_prefill for c in s.chunks)]
    assert len(whole) == 1 and whole[0].num_decode_tokens == 0
    assert whole[0].chunks[-1].num_tokens == len(workload.long_prompt)
    assert whole[0].step_index in chunked.paused_decode_steps(off)
    assert decoding_ids_at(off, whole[0].step_index)  # somebody was decoding and got nothing


def itertools_accumulate(values):
    total = 0
    for value in values:
        total += value
        yield total


@pytest.fixture(scope="module")
def tiny_comparison(tiny_llama):
    steps_seen = []
    comparison = chunked.compare_chunking(tiny_llama, tiny_workload(), progress=lambda n, record: steps_seen.append(n))
    return comparison, steps_seen


@pytest.fixture(scope="module")
def tiny_sweep(tiny_llama):
    return budget_sweep.budget_sweep(tiny_llama, tiny_workload(), [32, 8, 16])


def test_tiny_chunking_on_and_off_give_the_same_tokens_and_only_off_pauses_decodes(tiny_comparison):
    comparison, steps_seen = tiny_comparison
    check_chunking(comparison)
    assert steps_seen == list(range(1, comparison.off.num_steps + comparison.on.num_steps + 1))
    summary = comparison.summary_on
    assert summary.num_steps == comparison.on.num_steps and (
        summary.itl_max_ms >= summary.itl_p99_ms >= summary.itl_p50_ms > 0
    )
    assert summary.long_ttft_ms == pytest.approx(comparison.on.requests["long"].time_to_first_token_s * 1000)


def test_tiny_budget_sweep_outputs_match_and_bigger_budgets_take_fewer_steps(tiny_llama, tiny_sweep):
    sweep = tiny_sweep
    assert [(p.token_budget, p.enable_chunked_prefill) for p in sweep.points] == [
        (16, False), (8, True), (16, True), (32, True)
    ]
    assert all(p.outputs_match_off for p in sweep.points)
    steps = [p.summary.num_steps for p in sweep.points[1:]]
    assert steps == sorted(steps, reverse=True) and steps[0] > steps[-1]
    with pytest.raises(ConfigError, match="token_budget"):
        budget_sweep.budget_sweep(tiny_llama, tiny_workload(), [16, 0])


def test_bad_workloads_are_refused_before_running():
    with pytest.raises(ConfigError, match="token_budget"):
        tiny_workload(token_budget=0)
    with pytest.raises(ConfigError, match="block_size"):
        tiny_workload(block_size=0)
    with pytest.raises(RequestError):
        tiny_workload(long_prompt=())


def test_timeline_has_one_bar_per_chunk_and_labels_prefill_token_counts(tiny_comparison):
    comparison, _ = tiny_comparison
    for trace in (comparison.off, comparison.on):
        for x_axis in ("time", "step"):
            fig = chunked_figures.timeline_figure(trace, "t", x_axis)
            prefill, decode = fig.data
            chunks = [c for s in trace.steps for c in s.chunks]
            assert len(prefill.y) == sum(c.is_prefill for c in chunks) and (
                len(decode.y) == sum(not c.is_prefill for c in chunks)
            )
            long_labels = [int(t) for y, t in zip(prefill.y, prefill.text) if y == "long"]
            assert sum(long_labels) == len(comparison.workload.long_prompt)
            if x_axis == "time":
                assert "(ms)" in fig.layout.xaxis.title.text
                assert max(b + w for b, w in zip(decode.base, decode.x)) == pytest.approx(
                    max((s.start_time_s + s.wall_time_s) * 1000 for s in trace.steps)
                )
            else:
                assert sorted({round(b + 0.45) for b in list(prefill.base) + list(decode.base)}) == (
                    list(range(trace.num_steps))
                )
    summaries = {"chunking off": comparison.summary_off, "chunking on": comparison.summary_on}
    latency = chunked_figures.latency_figure(summaries, "t")
    assert [bar.name for bar in latency.data] == ["chunking off", "chunking on"]
    assert list(latency.data[1].y) == [summaries["chunking on"].itl_p50_ms, summaries["chunking on"].itl_p99_ms,
                                       summaries["chunking on"].itl_max_ms, summaries["chunking on"].long_ttft_ms]
    assert latency.layout.yaxis.title.text == "time (ms)"
    rows = chunked_figures.latency_rows(summaries)
    assert rows[0]["steps that paused a decode"] > 0 and rows[1]["steps that paused a decode"] == 0
    json.dumps(rows)


def test_sweep_figure_plots_one_point_per_budget_plus_chunking_off(tiny_sweep):
    sweep = tiny_sweep
    fig = chunked_figures.sweep_figure(sweep, "t")
    on, off = fig.data
    assert list(on.x) == [p.summary.long_ttft_ms for p in sweep.points[1:]]
    assert list(on.y) == [p.summary.itl_max_ms for p in sweep.points[1:]]
    assert list(off.text) == ["chunking off"] and off.x[0] == sweep.points[0].summary.long_ttft_ms
    assert "(ms)" in fig.layout.xaxis.title.text and "(ms)" in fig.layout.yaxis.title.text
    assert len(chunked_figures.sweep_rows(sweep)) == 4


def test_bundled_chunking_on_and_off_generate_the_same_text(bundled):
    workload = chunked.build_workload(
        bundled.tokenizer, num_short_requests=2, short_prompt_tokens=10, short_max_new_tokens=4,
        long_prompt_tokens=64, long_max_new_tokens=2, arrival_step=1, token_budget=24,
    )
    assert len(workload.long_prompt) == 64 and len(set(workload.short_prompts)) == 2
    comparison = chunked.compare_chunking(bundled.model, workload, model_id=bundled.model_id)
    check_chunking(comparison)
    assert comparison.device == "cpu" and comparison.dtype == "float32"


# ---------------------------------------------------------------- prefix cache
def tiny_stream(other_user=True, block_size=4):
    shared = random_ids(22, 10)
    prompts = [("q1", shared + random_ids(7, 11)), ("q2", shared + random_ids(9, 12))]
    if other_user:
        prompts.append((prefix.OTHER_REQUEST_ID, random_ids(40, 13)))
    prompts.append(("q3", shared + random_ids(5, 14)))
    return prefix.PrefixStream(tuple(prompts), num_shared_prefix_tokens=22, max_new_tokens=3, block_size=block_size)


def expected_cached_tokens(stream, request_id):
    """Full blocks of the longest prefix shared with an earlier request's prompt."""
    prompts = dict(stream.prompts)
    best = 0
    for earlier, _ in stream.prompts[: stream.request_ids.index(request_id)]:
        common = 0
        for a, b in zip(prompts[earlier], prompts[request_id]):
            if a != b:
                break
            common += 1
        best = max(best, common)
    best = min(best, len(prompts[request_id]) - 1)  # the last prompt token is always computed
    return best // stream.block_size * stream.block_size


def check_prefix(experiment):
    stream, on, off = experiment.stream, experiment.cache_on, experiment.cache_off
    full_prefix_tokens = stream.num_shared_full_blocks * stream.block_size
    for rid in stream.request_ids:
        assert on.trace.requests[rid].num_cached_tokens == expected_cached_tokens(stream, rid)
        assert off.trace.requests[rid].num_cached_tokens == 0
    questions = [rid for rid in stream.request_ids if rid.startswith("q")]
    assert on.trace.requests[questions[0]].num_cached_tokens == 0
    assert all(on.trace.requests[rid].num_cached_tokens >= full_prefix_tokens > 0 for rid in questions[1:])
    # vLLM's counters: every prompt token is a query, every reused token a hit
    queries = list(itertools_accumulate(len(p) for _, p in stream.prompts))
    hits = list(itertools_accumulate(on.trace.requests[rid].num_cached_tokens for rid in stream.request_ids))
    assert on.counters == list(zip(queries, hits))
    assert (on.trace.prefix_cache_queries, on.trace.prefix_cache_hits) == on.counters[-1]
    assert off.counters[-1] == (queries[-1], 0)
    # the blocks each request hit are the ones the prefix was computed into
    first_blocks = on.request_blocks(questions[0])
    for rid in questions[1:]:
        blocks = on.request_blocks(rid)
        num_hit = on.trace.requests[rid].num_cached_tokens // stream.block_size
        assert blocks.statuses[:num_hit] == ["hit"] * num_hit and "hit" not in blocks.statuses[num_hit:]
        assert blocks.physical_blocks[: stream.num_shared_full_blocks] == (
            first_blocks.physical_blocks[: stream.num_shared_full_blocks]
        )
        assert len(blocks.statuses) == math.ceil(blocks.num_prompt_tokens / stream.block_size)
        assert blocks.statuses[-1] == ("partial" if blocks.num_prompt_tokens % stream.block_size else "computed")
    # caching never changes what is generated
    for run in experiment.runs:
        assert all(check.identical for check in compare_outputs(off.trace, run.trace))
        assert all(len(r.output_token_ids) == stream.max_new_tokens for r in run.trace.requests.values())


@pytest.fixture(scope="module")
def tiny_prefix_experiment(tiny_llama):
    stream = tiny_stream()
    steps_seen = []
    experiment = prefix.run_prefix_experiment(
        tiny_llama, stream, small_num_blocks=stream.min_num_blocks, progress=lambda n, record: steps_seen.append(n)
    )
    assert steps_seen == list(range(1, sum(run.trace.num_steps for run in experiment.runs) + 1))
    return experiment


def test_tiny_prefix_stream_hits_the_shared_blocks_and_a_small_cache_evicts_them(tiny_prefix_experiment):
    experiment = tiny_prefix_experiment
    stream = experiment.stream
    assert stream.min_num_blocks == math.ceil((40 + 3) / 4)
    check_prefix(experiment)
    assert [e for e in experiment.cache_on.evictions() if e[2]] == []  # ample memory: nothing evicted
    small = experiment.small_cache
    assert small.num_blocks == stream.min_num_blocks
    evicted = [e for e in small.evictions() if e[2]]
    assert evicted and evicted[0][1] == prefix.OTHER_REQUEST_ID  # the other user's long prompt pushes blocks out
    lost = {rid: (ample, tight) for rid, ample, tight in experiment.lost_hits()}
    assert lost["q2"] == (20, 20)  # before the other user: still hits
    assert lost["q3"] == (20, 0)  # after it: the shared prefix was evicted, q3 recomputes it
    assert small.request_blocks("q3").statuses[0] == "computed"


def test_small_cache_too_small_for_a_request_is_refused(tiny_llama):
    stream = tiny_stream()
    with pytest.raises(RequestError, match="too small"):
        prefix.run_prefix_experiment(tiny_llama, stream, small_num_blocks=stream.min_num_blocks - 1)
    with pytest.raises(ConfigError, match="block_size"):
        tiny_stream(block_size=0)


def test_prefix_figures_draw_every_block_and_counter(tiny_prefix_experiment):
    experiment = tiny_prefix_experiment
    stream = experiment.stream
    on, small = experiment.cache_on, experiment.small_cache
    blocks = [on.request_blocks(rid) for rid in stream.request_ids]
    grid = prefix_figures.block_grid_figure(blocks, stream.block_size, "t", lambda rid, i: f"{rid}:{i}")
    by_status = {bar.name.split(" ")[0]: bar for bar in grid.data}
    assert sum(len(bar.y) for bar in grid.data) == sum(len(b.statuses) for b in blocks)
    assert sum(1 for y in by_status["cache"].y if y == "q2") == 5  # 22 shared tokens = 5 full blocks of 4
    assert [bar.marker.color for bar in grid.data] == [c for _, _, c in prefix_figures.BLOCK_STATUSES]
    rows = prefix_figures.hit_rate_rows(on)
    assert [(r["prefix_cache_queries (cumulative)"], r["prefix_cache_hits (cumulative)"]) for r in rows] == on.counters
    hit_rate = prefix_figures.hit_rate_figure(on, "t")
    assert list(hit_rate.data[1].y) == [on.trace.requests[rid].num_cached_tokens for rid in stream.request_ids]
    assert hit_rate.data[2].y[-1] == pytest.approx(100 * on.counters[-1][1] / on.counters[-1][0])
    ttft = prefix_figures.ttft_figure(experiment, "t")
    assert [bar.name for bar in ttft.data] == ["cache on", "cache off", "small cache"]
    assert ttft.layout.yaxis.title.text == "time to first token (ms)"
    evictions = prefix_figures.eviction_figure(small, "t")
    assert sum(evictions.data[0].y) == sum(len(s.blocks_evicted) for s in small.trace.steps) > 0
    assert list(evictions.data[1].y) == [s.num_free_blocks for s in small.trace.steps]
    json.dumps(prefix_figures.ttft_rows(experiment) + prefix_figures.eviction_rows(small))


def test_bundled_chat_stream_reuses_the_system_prompt(bundled):
    text, template = prefix.SHARED_PREFIXES["Chat: one system prompt, many users"]
    stream = prefix.build_stream(
        bundled.tokenizer, text, list(prefix.QUESTIONS[:2]), template, max_new_tokens=2, block_size=16,
        other_user_after=1
    )
    assert stream.request_ids == ["q1", prefix.OTHER_REQUEST_ID, "q2"]
    shared = stream.prompts[0][1][: stream.num_shared_prefix_tokens]
    assert all(p[: stream.num_shared_prefix_tokens] == shared for rid, p in stream.prompts if rid.startswith("q"))
    assert stream.num_shared_full_blocks >= 4
    experiment = prefix.run_prefix_experiment(
        bundled.model, stream, small_num_blocks=stream.min_num_blocks, model_id=bundled.model_id
    )
    check_prefix(experiment)
    assert experiment.cache_on.trace.requests["q2"].num_cached_tokens == stream.num_shared_full_blocks * 16
    assert any(step.blocks_evicted for step in experiment.small_cache.trace.steps)
    lost = {rid: tight for rid, _, tight in experiment.lost_hits()}
    assert lost["q2"] < experiment.cache_on.trace.requests["q2"].num_cached_tokens  # evicted by the other user's prompt


def test_build_stream_refuses_empty_input(bundled):
    text, template = prefix.SHARED_PREFIXES["Chat: one system prompt, many users"]
    with pytest.raises(RequestError, match="No questions"):
        prefix.build_stream(bundled.tokenizer, text, ["", "   "], template)
    with pytest.raises(RequestError, match="prefix is empty"):
        prefix.build_stream(bundled.tokenizer, "  ", ["Why?"], template)
