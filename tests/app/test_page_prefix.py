"""The Prefix cache page: a real stream sharing a system prompt (cache on, off, small cache),
and bad input (block size 0, no questions) shown inline with the earlier results kept."""

import math

from tests.app.pages import chart_specs, open_page


def test_stream_hits_the_system_prompt_and_keeps_results_after_bad_input(bundled):
    app = open_page("prefix_cache")
    assert not app.exception
    app.text_area(key="prefix_questions").set_value(
        "Why does a language model answer faster after it has read my question once?\n\nWhat is a cache?"
    )
    app.slider(key="prefix_new_tokens").set_value(2)
    app.run()
    app.button(key="prefix_run").click().run()
    assert not app.exception and not app.error
    assert "Identical outputs" in app.success[0].value

    experiment = app.session_state["results"]["prefix"]["experiment"]
    stream = experiment.stream
    assert stream.request_ids == ["q1", "q2"]  # the other user comes after q2 only when more questions follow
    full_prefix = stream.num_shared_full_blocks * stream.block_size
    assert full_prefix >= 64
    assert experiment.cache_on.trace.requests["q2"].num_cached_tokens == full_prefix
    queries = sum(len(p) for _, p in stream.prompts)
    # q2's prompt tokens: the stream's hit rate counts q1's cold start, the later one does not
    later = len(stream.prompts[1][1])
    assert [m.value for m in app.metric] == [
        f"{queries:,}", f"{full_prefix:,}", f"{100 * full_prefix / queries:.0f}%", f"{100 * full_prefix / later:.0f}%"]

    grid_on, grid_small, hit_rate, ttft, evictions = list(chart_specs(app).values())
    assert (sum(len(bar["y"]) for bar in grid_on["data"])
            == sum(math.ceil(len(p) / stream.block_size) for _, p in stream.prompts))
    hits = grid_on["data"][0]
    assert hits["name"].startswith("cache hit") and hits["y"].count("q2") == stream.num_shared_full_blocks
    assert hit_rate["data"][1]["y"] == [0, full_prefix]
    assert [bar["name"] for bar in ttft["data"]] == ["cache on", "cache off", "small cache"]
    assert "(ms)" in ttft["layout"]["yaxis"]["title"]["text"]
    assert experiment.small_cache.num_blocks == stream.min_num_blocks
    assert sum(evictions["data"][0]["y"]) == sum(len(s.blocks_evicted) for s in experiment.small_cache.trace.steps)

    app.number_input(key="prefix_block_size").set_value(0).run()
    app.button(key="prefix_run").click().run()
    assert not app.exception
    assert "block_size must be a positive whole number, got 0" in app.error[0].value
    assert len(list(chart_specs(app).values())) == 5 and "Identical outputs" in app.success[0].value

    app.number_input(key="prefix_block_size").set_value(16)
    app.text_area(key="prefix_questions").set_value("  \n ")
    app.run()
    app.button(key="prefix_run").click().run()
    assert "No questions" in app.error[0].value
    assert app.session_state["results"]["prefix"]["experiment"] is experiment
