"""The Parallel vs token-by-token page on the bundled model (fp32): both ways, the proof, a
small sweep, the roofline; an empty prompt gives an inline error and keeps the results."""

import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")
PAGE = "views/parallel_vs_sequential.py"
PROMPT_KEY = "parallel_prompt_Chat with a system prompt"
PROMPT = "Prefill reads the whole prompt at once, while decode makes one token at a time. Which is faster?"


def charts(app) -> dict[str, dict]:
    """Plotly figures on the page by widget key (the element id ends with the key)."""
    found = {}
    for chart in app.get("plotly_chart"):
        key = next(k for k in ("latency", "over_time", "difference", "sweep", "roofline")
                   if f"parallel_{k}_chart" in chart.proto.id)
        found[key] = json.loads(chart.proto.spec)
    return found


def test_both_ways_sweep_roofline_and_an_empty_prompt(bundled):
    app = AppTest.from_file(APP, default_timeout=240)
    app.session_state["sidebar_dtype"] = "float32"
    app.run()
    app.switch_page(PAGE).run()
    assert not app.exception
    num_tokens = len(bundled.tokenizer(PROMPT)["input_ids"])

    app.text_area(key=PROMPT_KEY).set_value(PROMPT)
    app.button(key="parallel_run").click().run()
    assert not app.exception and not app.error
    figures = charts(app)
    bars = figures["latency"]["data"]
    assert [len(bar["y"]) for bar in bars] == [1, num_tokens]  # 1 parallel step, N token-by-token steps
    assert all(y > 0 for bar in bars for y in bar["y"])
    proof = app.success[0].value
    assert "PASS" in proof and "float32, tolerance" in proof and "within the rounding of the dtype" in proof
    assert len(figures["difference"]["data"][0]["y"]) == 30  # max |ΔK| of every layer
    assert app.metric[2].value.endswith("×")
    captions = " ".join(c.value for c in app.caption)
    assert "the FLOPs of an average one-token step (the FLOP model; not" in captions  # counted, not assumed to be N
    assert ("a multiply and an add per weight, so an intensity of at most 2 ÷ "
            "bytes per weight = 0.5 FLOP/byte in float32") in " ".join(m.value for m in app.markdown)

    app.multiselect(key="parallel_sweep_parallel_sizes").set_value([8, 16, 32])
    app.multiselect(key="parallel_sweep_sequential_sizes").set_value([2, 4, 8])
    app.number_input(key="parallel_sweep_runs").set_value(1)
    app.button(key="parallel_sweep_run").click().run()
    assert not app.exception and not app.error
    sweep = charts(app)["sweep"]["data"]
    measured = {trace["name"]: trace for trace in sweep if trace["name"].endswith("measured")}
    assert [trace["x"] for trace in measured.values()] == [[8, 16, 32], [2, 4, 8]]
    assert all(t > 0 for trace in measured.values() for t in trace["y"])
    assert len(app.dataframe[0].value) == 2  # fitted a, b, c of both ways
    fitted = " ".join(c.value for c in app.caption)
    assert "attention's FLOPs, at the fitted b, predict" in fitted or "fitted as 0" in fitted  # which explains the bend

    app.multiselect(key="parallel_roofline_prefill").set_value([16, 32])
    app.multiselect(key="parallel_roofline_decode").set_value([16])
    app.number_input(key="parallel_roofline_runs").set_value(1)
    app.button(key="parallel_roofline_run").click().run()
    assert not app.exception and not app.error
    roofline = {trace["name"]: trace for trace in charts(app)["roofline"]["data"]}
    assert len(roofline["prefill steps (N tokens, 1 step)"]["x"]) == 2
    assert len(roofline["decode steps (1 token, context C)"]["x"]) == 1
    assert len(roofline["this prompt: parallel"]["x"]) == 1  # the comparison above, same model and dtype

    app.text_area(key=PROMPT_KEY).set_value("   ")
    app.button(key="parallel_run").click().run()
    assert not app.exception
    assert "empty" in app.error[0].value
    kept = charts(app)
    assert [len(bar["y"]) for bar in kept["latency"]["data"]] == [1, num_tokens]  # the earlier result is still shown
    assert {"sweep", "roofline"} <= set(kept)
