"""The Your server page without vLLM (tests/peer runs it against a real vllm serve): hosted mode
keeps the probe off unless the demo allow-lists URLs, a URL nobody serves is an inline error, and
the load sweep against the small one-engine HTTP server of tests/unit/test_probe_load.py."""

from streamlit.testing.v1 import AppTest

from tests.app.pages import chart_titled, open_page, plotly_array
from tests.unit.test_probe_load import OneEngine


def test_hosted_mode_turns_the_probe_off_without_an_allow_list(bundled, monkeypatch):
    monkeypatch.setenv("PREFILLVIZ_HOSTED", "1")
    monkeypatch.delenv("PREFILLVIZ_PROBE_URLS", raising=False)
    app = open_page("your_server", dtype=None)  # hosted mode fixes the dtype
    assert not app.exception
    assert any("Probing a server is off in this hosted demo" in i.value for i in app.info)
    assert not [t for t in app.text_input if t.key == "probe_url"] and not app.button  # nothing to press


def test_hosted_mode_offers_only_the_allow_listed_urls(bundled, monkeypatch):
    monkeypatch.setenv("PREFILLVIZ_HOSTED", "1")
    monkeypatch.setenv("PREFILLVIZ_PROBE_URLS", "http://127.0.0.1:9, http://10.0.0.7:8000")
    app = open_page("your_server", dtype=None)  # hosted mode fixes the dtype
    assert app.selectbox(key="probe_url").options == ["http://127.0.0.1:9", "http://10.0.0.7:8000"]
    app.button(key="probe_run").click().run()
    assert not app.exception
    assert any("Could not reach http://127.0.0.1:9" in e.value for e in app.error)  # allowed, but nothing listens there


def small_sweep(engine: OneEngine) -> AppTest:
    """The page after a small load sweep against ``engine``, which is closed after it (also when the sweep fails)."""
    try:
        app = open_page("your_server")
        app.text_input(key="probe_url").set_value(engine.url)
        app.slider(key="load_requests").set_value(4)
        app.slider(key="load_prompt_tokens").set_value(32)
        app.slider(key="load_output_tokens").set_value(2)
        app.button(key="load_run").click().run()
    finally:
        engine.close()
    return app


def test_the_load_sweep_draws_ttft_goodput_and_the_split_with_a_reading(bundled):
    engine = OneEngine()  # a real HTTP server: one prefill at a time, its own queue and prefill histograms
    app = small_sweep(engine)
    assert not app.exception and not app.error, [e.value for e in app.error]
    ttft = chart_titled(app, "Time to first token under load")
    assert ([d["name"] for d in ttft["data"]][:3] == ["TTFT p50", "TTFT p90", "TTFT p99"]
            and len(ttft["data"]) == 4)  # + goodput
    split = chart_titled(app, "Time to first token split into waiting and prefill")
    names = ["waiting before the scheduler (for the engine's running step; the API server)",
             "waiting in the scheduler's queue", "prefill (server)", "TTFT the client saw (mean)"]
    assert [d["name"] for d in split["data"]] == names
    assert len(plotly_array(split["data"][2]["y"])) >= 2 and min(plotly_array(split["data"][2]["y"])) > 0
    assert any("your TTFT is" in m.value or "half or more of your TTFT" in m.value for m in app.markdown)


def test_a_server_that_fails_mid_sweep_is_an_error_and_the_points_before_stay(bundled):
    engine = OneEngine(fail_after=3 + 4)  # the warm-up and the first load point, then HTTP 500
    app = small_sweep(engine)
    assert not app.exception
    assert any("The server started failing at load" in e.value and "HTTP 500" in e.value
               for e in app.error), [e.value for e in app.error]
    # the first point, kept
    assert len(plotly_array(chart_titled(app, "Time to first token under load")["data"][0]["x"])) == 1


def test_hosted_mode_bounds_the_sweep_before_it_sends_anything(bundled, monkeypatch):
    engine = OneEngine()
    monkeypatch.setenv("PREFILLVIZ_HOSTED", "1")
    monkeypatch.setenv("PREFILLVIZ_PROBE_URLS", engine.url)
    try:
        app = open_page("your_server", dtype=None)  # hosted mode fixes the dtype
        assert app.selectbox(key="probe_url").options == [engine.url]
        app.slider(key="load_requests").set_value(32)
        app.button(key="load_run").click().run()
    finally:
        engine.close()
    assert not app.exception
    assert any("would go over its bounds: requests (196 > 60)" in e.value
               for e in app.error), [e.value for e in app.error]
    assert engine.num_posts == 0  # refused whole, before the calibration request
