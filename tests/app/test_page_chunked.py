"""The Chunked prefill page: a real run of a small workload, chunking off and on, the budget
sweep, and a bad token budget shown inline with the earlier results kept."""


from tests.app.pages import chart_specs, open_page, small_chunked_workload


def timeline_steps(spec):
    """Step indices drawn in a timeline (x axis = engine step: each bar starts at step - 0.45)."""
    return sorted({round(base + 0.45) for bar in spec["data"] for base in bar["base"]})


def test_small_workload_runs_off_and_on_and_keeps_results_after_a_bad_budget(bundled):
    app = open_page("chunked_prefill")
    assert not app.exception
    small_chunked_workload(app)
    app.radio(key="chunked_timeline_x").set_value("engine step")
    app.run()
    app.button(key="chunked_run").click().run()
    assert not app.exception and not app.error
    assert "Identical outputs: all 3 requests" in app.success[0].value

    comparison = app.session_state["results"]["chunked"]["comparison"]
    # chunking on, by hand: step 0 prefills both short prompts (16 tokens); the long prompt arrives;
    # steps 1-2 run 2 decodes + 22 prompt tokens; step 3 the last 20 prompt tokens (the short
    # requests are done after 3 tokens); steps 4-6 decode the long request's 3 more tokens.
    assert comparison.on.num_steps == 7
    # chunking off: step 0 both prompts, step 1 the whole long prompt alone (the short requests
    # wait), steps 2-3 decode all three, step 4 the long request's last token
    assert comparison.off.num_steps == 5
    specs = list(chart_specs(app).values())
    assert len(specs) == 3
    off_spec, on_spec, latency_spec = specs
    assert timeline_steps(off_spec) == list(range(5)) and timeline_steps(on_spec) == list(range(7))
    on_prefill = on_spec["data"][0]
    assert [int(t) for y, t in zip(on_prefill["y"], on_prefill["text"]) if y == "long"] == [22, 22, 20]
    off_prefill = off_spec["data"][0]
    assert [int(t) for y, t in zip(off_prefill["y"], off_prefill["text"]) if y == "long"] == [64]
    assert sum(len(bar["y"]) for bar in on_spec["data"]) == sum(len(s.chunks) for s in comparison.on.steps)
    assert [bar["name"] for bar in latency_spec["data"]] == ["chunking off", "chunking on"]
    assert latency_spec["data"][1]["y"][3] == comparison.summary_on.long_ttft_ms
    caption = next(c.value for c in app.caption if "Last run" in c.value)
    assert "timing pass (nothing captured)" in caption and "cpu, float32" in caption

    app.multiselect(key="chunked_sweep_budgets").set_value([64])
    app.button(key="chunked_sweep_run").click().run()
    assert not app.exception and not app.error
    sweep_spec = list(chart_specs(app).values())[-1]
    assert len(chart_specs(app)) == 4 and sweep_spec["data"][1]["text"] == ["chunking off"]
    assert sweep_spec["data"][0]["text"] == ["budget 64"]

    app.number_input(key="chunked_token_budget").set_value(0).run()
    app.button(key="chunked_run").click().run()
    assert not app.exception
    assert "token_budget must be a positive whole number, got 0" in app.error[0].value
    assert len(chart_specs(app)) == 4 and "Identical outputs" in app.success[0].value  # earlier results still shown
    assert app.session_state["results"]["chunked"]["comparison"] is comparison


def test_without_vllm_the_page_says_how_to_get_it_and_works(bundled, monkeypatch, tmp_path):
    from prefillviz.peers import vllm_client

    monkeypatch.setattr(vllm_client, "VLLM_VENV", tmp_path / "no-venv")
    app = open_page("chunked_prefill")
    app.slider(key="chunked_long_prompt_tokens").set_value(64)
    app.run()
    app.button(key="chunked_run").click().run()
    assert not app.exception and not app.error
    assert any("make vllm" in info.value for info in app.info)
    assert not [b for b in app.button if b.key == "chunked_vllm_run"]  # no button that can't work
