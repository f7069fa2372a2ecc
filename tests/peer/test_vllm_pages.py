"""The pages' "Run on vLLM too": real vLLM's schedule next to ours, and the diff, in the app."""

import pytest

from tests.app.pages import chart_specs, open_page, plotly_array, small_chunked_workload

pytestmark = pytest.mark.usefixtures("needs_vllm")


def test_the_chunked_page_runs_both_ways_on_vllm_and_explains_where_chunking_off_differs(bundled):
    app = open_page("chunked_prefill")
    small_chunked_workload(app)
    app.run()
    app.button(key="chunked_run").click().run()
    before = len(chart_specs(app))
    app.button(key="chunked_vllm_run").click().run()
    assert not app.exception and not app.error
    on = next(s.value for s in app.success if "chunking on: against vLLM" in s.value)
    assert "outputs: 3 of 3 the same" in on and "schedule: the same, step by step" in on
    off = next(w.value for w in app.warning if "chunking off: against vLLM" in w.value)
    assert "outputs: 3 of 3 the same" in off and "schedule: differs first at step 1 (ours {'long': 64}" in off
    assert any("With chunking off" in m.value for m in app.markdown)  # what differs and why, from vLLM's scheduler
    titles = [spec["layout"]["title"]["text"] for spec in chart_specs(app).values()]
    assert len(titles) == before + 4  # vLLM's two timelines, and both block maps
    assert (sum(t.startswith("vLLM, chunking") for t in titles) == 2
            and sum(t.startswith("Blocks, ") for t in titles) >= 2)
    off_run, on_run = app.session_state["results"]["chunked_vllm"]
    # 2 decodes + 22 prompt tokens in a budget of 24
    assert [c.num_tokens for c in on_run.theirs.steps[1].chunks if c.request_id == "long"] == [22]
    assert ({c.request_id: c.num_tokens for c in off_run.theirs.steps[1].chunks}
            == {"short-1": 1, "short-2": 1, "long": 64})


def test_the_prefix_page_finds_the_same_prefix_hits_on_vllm(bundled):
    app = open_page("prefix_cache")
    app.slider(key="prefix_new_tokens").set_value(2)
    app.checkbox(key="prefix_small_cache").set_value(False)
    app.run()
    app.button(key="prefix_run").click().run()
    app.button(key="prefix_vllm_run").click().run()
    assert not app.exception and not app.error
    verdict = next(s.value for s in app.success if "against vLLM" in s.value)
    assert "cached tokens: the same for every request" in verdict and "schedule: the same" in verdict
    bars = next(spec for spec in chart_specs(app).values()
                if spec["layout"]["title"]["text"].startswith("Prompt tokens from the prefix cache"))
    ours, theirs = (list(plotly_array(bar["y"])) for bar in bars["data"])
    # the first computes the prefix, later ones hit whole blocks of it
    assert ours == theirs and ours[0] == 0 and max(ours) >= 32
    grids = {spec["layout"]["title"]["text"]: spec for spec in chart_specs(app).values()
             if spec["layout"]["title"]["text"].startswith("Blocks, ")}
    ours_grid, theirs_grid = grids["Blocks, ours (cache on)"], grids["Blocks, vLLM (cache on)"]
    cells = lambda grid: {bar["name"]: list(bar["y"]) for bar in grid["data"]}  # noqa: E731 status -> the request of each cell
    assert cells(ours_grid) == cells(theirs_grid) and cells(theirs_grid)["cache hit (K/V reused)"]


def test_the_parallel_page_runs_the_prompt_both_ways_on_vllm(bundled):
    app = open_page("parallel_vs_sequential")
    app.text_area(key="parallel_prompt_Chat with a system prompt").set_value(
        "Prefill reads the whole prompt at once. Decode makes one token at a time.")
    app.button(key="parallel_run").click().run()
    app.button(key="parallel_vllm_run").click().run()
    assert not app.exception and not app.error
    verdicts = [s.value for s in app.success if "against vLLM" in s.value]
    assert len(verdicts) == 2 and all("schedule: the same, step by step" in v and "outputs: 1 of 1 the same" in v
                                      for v in verdicts)
    runs = app.session_state["results"]["parallel_vllm"]
    n = len(runs[0].ours.requests["prompt"].prompt_token_ids)
    # vLLM too: one step of N tokens, or N steps of one (budget 1)
    assert [run.theirs.num_steps for run in runs] == [1, n]
    assert [len(run.theirs_ttft_s) for run in runs] == [3, 1]
    bars = next(spec for spec in chart_specs(app).values()
                if spec["layout"]["title"]["text"].startswith("Time to first token: our engine and vLLM"))
    assert [bar["name"] for bar in bars["data"]] == ["ours", "vLLM"]
