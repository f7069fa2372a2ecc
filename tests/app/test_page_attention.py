"""The Attention page: maps rebuilt from the captured q/k of a real run of the bundled model."""

import numpy as np

from tests.app.pages import after_a_prefill_run, chart_titled, open_page, plotly_array, run_inspection_here


def test_run_draws_the_head_grid_and_pickers_change_the_head(bundled):
    app = open_page("attention")
    assert not app.exception
    run_inspection_here(app, "attention", chunk_size=6)
    assert not app.exception and not app.error
    grid = chart_titled(app, "Every head")
    entropy, sink = grid["data"][0], grid["data"][2]
    assert plotly_array(entropy["x"]).size == plotly_array(sink["x"]).size == 30 * 9
    assert sorted(set(plotly_array(entropy["y"]).tolist())) == list(range(30))
    assert sorted(set(plotly_array(entropy["x"]).tolist())) == list(range(9))
    attention = chart_titled(app, "Layer 0, head 0")
    z = plotly_array(attention["data"][0]["z"])
    n = z.shape[0]
    assert z.shape == (n, n) and n > 10
    assert len(attention["layout"]["shapes"]) == -(-n // 6)  # one strip per chunk
    app.selectbox(key="attention_layer").set_value(12).run()
    app.selectbox(key="attention_head").set_value(7).run()
    assert not app.exception
    other = plotly_array(chart_titled(app, "Layer 12, head 7 (KV head 2)")["data"][0]["z"])
    assert other.shape == (n, n) and not np.allclose(np.nan_to_num(other), np.nan_to_num(z))
    outline = chart_titled(app, "Every head")["data"][1]  # the picked head is outlined in the grid
    assert (plotly_array(outline["y"])[0], plotly_array(outline["x"])[0]) == (12, 7)


def test_empty_prompt_gives_an_inline_error_and_keeps_the_last_run(bundled):
    app = open_page("attention")
    run_inspection_here(app, "attention")
    before = plotly_array(chart_titled(app, "Layer 0, head 0")["data"][0]["z"])
    run_inspection_here(app, "attention", prompt="")
    assert not app.exception
    assert "empty" in app.error[0].value
    np.testing.assert_array_equal(plotly_array(chart_titled(app, "Layer 0, head 0")["data"][0]["z"]), before)


def test_shows_the_prefill_pages_run(bundled):
    app = after_a_prefill_run("attention")
    assert not app.exception
    assert "the Prefill page's run" in " ".join(c.value for c in app.caption)
    attention = chart_titled(app, "Layer 0, head 0")
    assert plotly_array(attention["data"][0]["z"]).shape == (5, 5)  # "The capital of France is"
    assert attention["data"][0]["x"][1].startswith("1 ")  # token labels
    assert not attention["layout"].get("shapes")  # one step: no chunk strips
