"""The Kernel timings page on the bundled model (fp32): a real run draws every figure from
measured data and offers the Chrome trace; an empty prompt gives an inline error and keeps
the earlier result; "Measure peaks again" adds a measurement and the prediction follows the
new best peaks."""

import datetime
import json
import re
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from prefillviz.analysis.machine_peaks import MachinePeaks
from prefillviz.machine.devices import machine_name
from prefillviz.measure import peaks_history

APP = str(Path(__file__).resolve().parents[2] / "app.py")
PAGE = "views/kernels.py"


def kernels_page():
    app = AppTest.from_file(APP, default_timeout=240)
    app.run()
    app.selectbox(key="sidebar_dtype").set_value("float32").run()
    app.switch_page(PAGE).run()
    app.selectbox(key="kernels_preset").set_value("Short question").run()
    app.multiselect(key="kernels_sweep_cpu").set_value([64]).run()  # one small N keeps the test short
    app.number_input(key="kernels_layer_of_30").set_value(5).run()
    return app


@pytest.fixture(scope="module")
def measured(bundled, tmp_path_factory):
    """The page after one real run (shared: a run takes ~20 s on a busy 2-core machine).

    The machine's peaks are measured into a cache file of the module's own, so the count of
    measurements starts at one and the tests add to it, not to the user's cache.
    """
    peaks_dir = tmp_path_factory.mktemp("peaks")
    cache_path = peaks_history.peaks_cache_path
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(peaks_history, "peaks_cache_path",
                      lambda device="cpu", dtype="float32": peaks_dir / cache_path(device, dtype).name)
        app = kernels_page()
        # before a run: only the measured dispatch the warm-up made, one chart per op family
        assert [chart.key for chart in app.get("plotly_chart")] == [
            "kernels_dispatch_attention_chart", "kernels_dispatch_linears_chart"]
        app.button(key="kernels_run").click().run()
        yield app


def charts(app) -> dict[str, dict]:
    return {chart.proto.id: json.loads(chart.proto.spec) for chart in app.get("plotly_chart")}


def layer_chart(app) -> dict:
    return next(spec for spec in charts(app).values()
                if spec["layout"]["title"]["text"].startswith("Time per decoder layer"))


def test_measure_draws_every_figure_from_real_data_and_offers_the_chrome_trace(measured):
    app = measured
    assert not app.exception and not app.error

    specs = list(charts(app).values())
    titles = [spec["layout"]["title"]["text"] for spec in specs]
    # dispatch x 2, layers, prediction, ops, timeline, kernel time + memory, 3 x benchmark time + memory
    assert len(specs) == 14, titles
    bars = layer_chart(app)["data"]
    assert [trace["name"] for trace in bars][:3] == ["attention", "MLP", "norms"]
    assert all(len(trace["y"]) == 30 for trace in bars) and all(y > 0 for y in bars[1]["y"])
    assert any("timing pass" in title for title in titles) and any("torch.profiler" in title for title in titles)
    assert any("on cpu, float32" in caption.value for caption in app.caption)

    timeline = next(spec for spec in specs if spec["layout"]["title"]["text"].startswith("Timeline"))
    assert {trace["name"]: len(trace["x"]) for trace in timeline["data"]}["mlp"] == 30
    kernel_time = next(spec for spec in specs if spec["layout"]["title"]["text"].startswith("Attention kernels on N"))
    assert [trace["name"] for trace in kernel_time["data"]] == ["v1 naive", "v2 sdpa", "v3 blocked"]

    labels = [button.proto.label for button in app.get("download_button")]
    assert "Chrome trace (JSON)" in labels and labels.count("Data (CSV)") >= 5


def test_empty_prompt_shows_an_inline_error_and_keeps_the_last_result(measured):
    app = measured
    before = layer_chart(app)["data"][1]["y"]
    app.text_area(key="kernels_prompt_Short question").set_value("   ").run()
    app.button(key="kernels_run").click().run()
    assert not app.exception
    assert "empty" in app.error[0].value
    assert layer_chart(app)["data"][1]["y"] == before  # the earlier run is still shown


def num_peak_measurements(app) -> int:
    label = next(caption.value for caption in app.caption if caption.value.startswith("Peaks: "))
    return int(re.match(r"Peaks: (?:the best of )?(\d+) measurements?", label).group(1))


def metric_value(app, label: str) -> str:
    return next(metric.value for metric in app.metric if metric.label == label)


def test_measure_peaks_again_adds_a_measurement_and_the_prediction_uses_the_new_best(measured, monkeypatch):
    app = measured
    assert num_peak_measurements(app) == 1  # the run measured into the module's own cache
    before = {"peaks": metric_value(app, "Machine peaks"), "mlp": metric_value(app, "MLP: measured / predicted")}
    measurements = []

    def far_faster(device, dtype):  # roofs no CPU has: certainly the new best
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        machine = machine_name(device)
        measurements.append(MachinePeaks(str(device), dtype, 1e6, 1e5, now, machine, torch.get_num_threads(), 1e5, 1e5,
                                         other_cpu_percent=0.0))
        return measurements[-1]

    monkeypatch.setattr(peaks_history, "measure_peaks", far_faster)
    app.button(key="kernels_measure_peaks").click().run()
    assert not app.exception and not app.error
    assert len(measurements) == 1
    assert num_peak_measurements(app) == 2
    assert metric_value(app, "Machine peaks") == "1,000,000 GFLOP/s" != before["peaks"]
    assert metric_value(app, "MLP: measured / predicted") != before["mlp"]  # predicted from the new roofs

    monkeypatch.setattr(peaks_history, "measure_peaks", lambda device, dtype: pytest.fail("measured without a click"))
    app.run()  # a rerun without a click keeps the new peaks and measures nothing
    assert num_peak_measurements(app) == 2 and metric_value(app, "Machine peaks") == "1,000,000 GFLOP/s"


def test_the_page_shows_the_measured_choice_and_measures_it_again(measured, monkeypatch, tmp_path):
    from prefillviz.backends import dispatch_tuning

    # an empty folder: the table below is measured here, not read
    monkeypatch.setenv("PREFILLVIZ_DISPATCH_CACHE", str(tmp_path))

    app = measured
    text = " ".join(block.value for block in app.markdown)
    assert "attention: " in text and "linears: " in text and "x faster than" in text
    attention = next(spec for spec in charts(app).values()
                     if spec["layout"]["title"]["text"].startswith("Measured dispatch: attention"))
    assert [bar["x"] for bar in attention["data"]][0] == [
        "decode", "mixed", "prefill 128", "prefill 512", "prefill 2048"]
    chosen = [(bar["name"], x) for bar in attention["data"] for x, label in zip(bar["x"], bar["text"])
              if label == "chosen"]
    assert len(chosen) == 5  # one chosen candidate per step shape
    calls = []
    real = dispatch_tuning.measure
    monkeypatch.setattr(dispatch_tuning, "measure", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    app.button(key="kernels_dispatch_again").click().run()
    assert calls == [1] and not app.exception


def test_the_two_backends_run_the_same_prompt_side_by_side(bundled):
    """What tuning buys: the textbook and the measured backend prefill the page's prompt in turns; the page shows
    both times, their ratio, each one's layer parts and what each step ran."""
    app = kernels_page()
    app.button(key="kernels_backends_run").click().run()
    assert not app.exception and not app.error
    textbook, tuned, ratio = (m.value for m in app.metric[:3])
    assert textbook.endswith(" ms") and tuned.endswith(" ms") and re.fullmatch(r"\d+\.\d\dx (faster|slower)", ratio)
    spec = charts(app)[next(c.proto.id for c in app.get("plotly_chart") if c.key == "kernels_backends_chart")]
    assert [bar["x"] for bar in spec["data"]] == [["textbook", "measured"]] * 4  # attention, MLP, norms, other
    assert all(y > 0 for bar in spec["data"][:2] for y in bar["y"])  # attention and MLP took time on both
    ran = app.dataframe[0].value
    assert list(ran["backend"]) == ["textbook", "measured"]
    assert "torch SDPA" in ran["what its step ran"][0] and "bucket: prefill_128" in ran["what its step ran"][1]


def test_the_sidebar_switches_every_run_to_the_textbook_backend(bundled):
    app = AppTest.from_file(APP, default_timeout=240)
    app.run()
    app.selectbox(key="sidebar_dtype").set_value("float32").run()
    app.radio(key="sidebar_backend").set_value("textbook").run()
    card = " ".join(m.value for m in app.sidebar.markdown)
    assert "forward: engine forward, textbook ops (plain torch)" in card
    app.button(key="prefill_run").click().run()
    assert not app.exception and app.metric[2].value == "' Paris'"
    assert any("textbook ops (plain torch)" in c.value for c in app.caption)  # the result says which ops measured it
