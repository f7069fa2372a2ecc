"""The KV cache page: a real inspection run of the bundled model, drawn from its write log."""

import numpy as np

from tests.app.pages import after_a_prefill_run, chart_specs, chart_titled, open_page, plotly_array, run_inspection_here


def heatmap_spec(app):
    return chart_titled(app, "KV writes")


def test_run_on_the_page_draws_measured_figures(bundled):
    app = open_page("kv_cache")
    assert not app.exception
    run_inspection_here(app, "kv", chunk_size=5)
    assert not app.exception and not app.error
    assert len(app.get("plotly_chart")) == 4
    heatmap = heatmap_spec(app)["data"][0]
    num_tokens = len(plotly_array(heatmap["x"]))
    assert plotly_array(heatmap["z"]).shape == (30, num_tokens) and num_tokens > 10  # the model's layers x the prompt
    assert "steps of up to 5 tokens" in " ".join(c.value for c in app.caption)
    bars = next(spec for spec in chart_specs(app).values() if spec["layout"]["title"]["text"].startswith("GQA"))
    assert list(plotly_array(bars["data"][0]["y"])) == [46080, 138240]
    app.radio(key="kv_quantity").set_value("bytes").run()
    assert np.all(plotly_array(heatmap_spec(app)["data"][0]["z"]) == 1536)


def test_empty_prompt_gives_an_inline_error_and_keeps_the_last_run(bundled):
    app = open_page("kv_cache")
    run_inspection_here(app, "kv")
    before = plotly_array(heatmap_spec(app)["data"][0]["z"])
    run_inspection_here(app, "kv", prompt="   ")
    assert not app.exception
    assert "empty" in app.error[0].value
    np.testing.assert_array_equal(plotly_array(heatmap_spec(app)["data"][0]["z"]), before)


def test_shows_the_prefill_pages_run(bundled):
    app = after_a_prefill_run("kv_cache")
    assert not app.exception
    assert "the Prefill page's run" in " ".join(c.value for c in app.caption)
    heatmap = heatmap_spec(app)["data"][0]
    assert plotly_array(heatmap["z"]).shape == (30, 5)  # "The capital of France is"
    run_inspection_here(app, "kv")  # a run here is shown next, and the Prefill run stays one click away
    assert app.radio(key="kv_source").value == "a run on this page"
    assert plotly_array(heatmap_spec(app)["data"][0]["z"]).shape[1] > 5
    app.radio(key="kv_source").set_value("the Prefill page's last run").run()
    assert plotly_array(heatmap_spec(app)["data"][0]["z"]).shape == (30, 5)
