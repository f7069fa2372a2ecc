"""The Long prompts page on the bundled model (fp32): it draws without a run, and "Show the kept blocks"
draws every head's real attention with the kept tiles, their share stated from the run."""

import re

from tests.app.pages import chart_titled, open_page, plotly_array


def test_kept_blocks_over_the_real_attention(bundled):
    app = open_page("long_prompts")
    assert not app.exception
    assert [h.value[:3] for h in app.header][:3] == ["1 ·", "2 ·", "3 ·"]  # the wall, the blocks, the trade-off
    app.select_slider(key="long_map_tokens").set_value(512)
    app.number_input(key="long_layer").set_value(3)
    app.select_slider(key="long_map_keep").set_value(0.5)
    app.button(key="long_map_run").click().run()
    assert not app.exception
    spec = chart_titled(app, "Layer 3, N = 512")
    heatmaps = [trace for trace in spec["data"] if trace["type"] == "heatmap"]
    kept = [trace for trace in spec["data"] if trace["type"] == "scatter"]
    assert len(heatmaps) == 9 and len(kept) == 9  # SmolLM2's 9 query heads
    for trace in kept:  # 4 blocks of 128: keep 0.5 keeps 1, 2, 2, 2 blocks of query blocks 0-3
        assert len(plotly_array(trace["x"])) == 7
        assert all(x <= y for x, y in zip(plotly_array(trace["x"]), plotly_array(trace["y"])))  # causal
    caption = " ".join(c.value for c in app.caption)
    assert re.search(r"70% of the causal tiles kept", caption)  # 7 of 10


def test_the_wall_and_the_trade_off_are_drawn_and_stated_from_their_runs(bundled):
    from prefillviz.experiments.long_prompt_wall import run_wall
    from prefillviz.experiments.sparse_prefill import compare_dense_sparse

    wall = run_wall(bundled, [128, 256, 384])
    trade = compare_dense_sparse(bundled, 300, (1.0, 0.5), runs=1)
    app = open_page("long_prompts")
    app.session_state["results"] = {"long_wall": wall, "long_trade": trade}
    app.run()
    assert not app.exception
    titles = {spec["layout"]["title"]["text"] for spec in (chart_titled(app, t) for t in (
        "Where the time", "Attention against", "Time to first token", "Per layer at N = 384", "The trade-off"))}
    assert len(titles) == 5
    text = " ".join(m.value for m in app.markdown)
    assert f"The FLOP model puts it at **{wall.flop_crossover_tokens:,}** tokens" in text
    share = sum(c.attention_share for c in trade) / len(trade)
    assert f"could be at most **{1 / (1 - share):.2f}×** faster" in text  # Amdahl, from the measurement
    table = app.dataframe[0].value
    assert list(table["keep"]) == [1.0, 0.5] and list(table["greedy agree / 32"])[0] == 32
