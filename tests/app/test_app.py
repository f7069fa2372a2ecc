"""The app shell and the Prefill page: a real prefill of the bundled model, bad input kept inline."""

from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def make_app():
    app = AppTest.from_file(APP, default_timeout=240)
    app.run()
    app.selectbox(key="sidebar_dtype").set_value("float32").run()
    return app


def test_sidebar_card_describes_the_loaded_model(bundled):
    app = make_app()
    card = " ".join(m.value for m in app.sidebar.markdown)
    assert "30 layers · 9 heads · 3 KV heads · head dim 64" in card
    assert "46,080 B per token" in card


def test_every_page_draws_the_sidebar_and_its_settings_follow_the_user_across_pages(bundled):
    app = make_app()  # float32 picked on the Prefill page
    app.toggle(key="presenter_mode").set_value(True).run()
    for page in ("kv_cache", "kernels", "prefill"):
        app.switch_page(f"views/{page}.py").run()
        assert not app.exception
        assert app.selectbox(key="sidebar_dtype").value == "float32" and app.toggle(key="presenter_mode").value
        assert "46,080 B per token" in " ".join(m.value for m in app.sidebar.markdown)  # fp32's 4-byte KV, not bf16's
        assert any("Share this view" in e.label for e in app.sidebar.expander)


def test_a_view_runs_on_its_own_without_app_py(bundled):
    view = AppTest.from_file(str(Path(APP).parent / "views" / "kv_cache.py"), default_timeout=240)
    view.run()
    assert not view.exception
    assert view.title[0].value.startswith("KV cache") and any("B per token" in m.value for m in view.sidebar.markdown)
    assert view.selectbox(key="sidebar_dtype").value == "auto"  # its own sidebar, from page_frame


def test_run_prefill_shows_measured_figures(bundled):
    app = make_app()
    app.selectbox(key="prefill_preset").set_value("Short question").run()
    app.button(key="prefill_run").click().run()
    assert not app.exception and not app.error
    assert app.metric[2].value == "' Paris'"
    # 5 tokens: a fixed cost, not a rate
    assert app.metric[1].label == "Forward pass" and "No tokens/s for" in " ".join(c.value for c in app.caption)
    charts = {chart.proto.id: chart for chart in app.get("plotly_chart")}
    assert len(charts) == 3
    app.slider(key="prefill_temperature").set_value(1.0).run()
    app.slider(key="prefill_top_k").set_value(3).run()
    assert not app.exception and app.metric[2].value == "' Paris'"


def test_empty_prompt_shows_an_error_and_keeps_the_last_result(bundled):
    app = make_app()
    app.selectbox(key="prefill_preset").set_value("Short question").run()
    app.button(key="prefill_run").click().run()
    app.text_area(key="prefill_prompt").set_value("   ").run()
    app.button(key="prefill_run").click().run()
    assert "empty" in app.error[0].value
    assert app.metric[2].value == "' Paris'"  # the earlier result is still shown


def test_unknown_model_gives_a_message_and_the_page_stays_usable(bundled):
    app = make_app()
    app.text_input(key="sidebar_custom_model").set_value("/no/such/model/folder").run()
    assert not app.exception
    assert any("/no/such/model/folder" in e.value for e in app.sidebar.error)
    app.text_input(key="sidebar_custom_model").set_value("").run()
    app.button(key="prefill_run").click().run()
    assert not app.exception and app.metric[2].value == "' Paris'"


def test_a_downloaded_run_bundle_loads_back_without_running_the_model(bundled):
    from prefillviz.experiments.prefill import load_prefill_bundle, prefill_bundle, run_prefill
    from prefillviz.instrument.trace_io import trace_summary

    result = run_prefill(bundled, "The capital of France is")
    again = load_prefill_bundle(prefill_bundle(result))
    assert again.token_texts == result.token_texts and again.prompt == result.prompt
    assert trace_summary(again.timing) == trace_summary(result.timing)
    assert (again.inspection.captured_qk["req-0"].keys[3] == result.inspection.captured_qk["req-0"].keys[3]).all()
    app = make_app()
    app.session_state["results"] = {"prefill": again}
    app.run()
    assert not app.exception and app.metric[2].value == "' Paris'"


def test_choosing_a_preset_fills_the_prompt(bundled):
    app = make_app()
    app.selectbox(key="prefill_preset").set_value("Code").run()
    assert app.text_area(key="prefill_prompt").value.startswith("def merge_sorted")


def test_a_shared_link_opens_with_its_prompt_and_settings(bundled):
    app = AppTest.from_file(APP, default_timeout=240)
    app.query_params.update({"prompt": "Shared prompt from a teacher", "dtype": "float32", "presenter": "1",
                             "token_budget": "junk", "model": "../x"})
    app.run()
    assert not app.exception
    assert app.text_area(key="prefill_prompt").value == "Shared prompt from a teacher"
    assert app.selectbox(key="sidebar_dtype").value == "float32"
    assert app.toggle(key="presenter_mode").value is True
    notes = " ".join(c.value for c in app.sidebar.caption)
    assert "model" in notes and "token_budget" in notes  # junk is ignored and said so
    link = app.sidebar.code[0].value
    assert "prompt=Shared+prompt+from+a+teacher" in link and "dtype=float32" in link and "presenter=1" in link


def test_an_out_of_memory_run_shows_a_message_frees_and_the_next_run_works(bundled, monkeypatch):
    """Failure injection: the model's forward raises the CPU allocator's error once."""
    from prefillviz.engine.runner import ModelRunner

    real_forward = ModelRunner.forward
    failures = [RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                             "you tried to allocate 8 GB")]

    def forward_that_fails_once(self, inputs, observer=None):
        if failures:
            raise failures.pop()
        return real_forward(self, inputs, observer)

    monkeypatch.setattr(ModelRunner, "forward", forward_that_fails_once)
    app = make_app()
    app.button(key="prefill_run").click().run()
    assert not app.exception
    assert "Out of memory" in app.error[0].value
    app.button(key="prefill_run").click().run()
    assert not app.exception and not app.error
    assert app.metric[2].value == "' Paris'"


def test_sidebar_says_why_the_linears_are_stock_and_flags_a_slow_dtype(bundled, monkeypatch):
    from prefillviz.backends import packed_weights
    from prefillviz.measure.dtype_speed import DtypeSpeed
    from prefillviz.ui import sidebar as shell

    reason = "this CPU can't run oneDNN's packed bfloat16 matmul (forced by the test)"
    monkeypatch.setattr(packed_weights, "cpu_runs_packed_linear", lambda dtype: (False, reason))
    # nor oneDNN's own matmul, as on an AVX2-only CPU
    monkeypatch.setattr(packed_weights, "onednn_linear", lambda dtype: None)
    monkeypatch.setattr(shell, "dtype_speed",
                        lambda device, dtype: DtypeSpeed(str(device), "bfloat16", 3.21, "a test matmul"))
    app = AppTest.from_file(APP, default_timeout=240)
    app.run()
    app.selectbox(key="sidebar_dtype").set_value("bfloat16").run()
    assert not app.exception
    card = " ".join(m.value for m in app.sidebar.markdown)
    assert f"measured backend's linears: stock linear layers ({reason})" in card and "warmed up in" in card
    assert any("bfloat16 runs 3.2x slower than float32" in w.value for w in app.sidebar.warning)
    app.button(key="prefill_run").click().run()  # and it still runs
    assert not app.exception and app.metric[2].value
