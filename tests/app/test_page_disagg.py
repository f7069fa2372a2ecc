"""The Disaggregated prefill page: a real run of a small workload (one engine off and on, then two
worker processes), its Gantt, the three set-ups and the transfer checks; then a worker killed
mid-transfer shows an inline error, keeps the earlier results, and leaves no process behind."""

import functools
import multiprocessing

from prefillviz.disagg import experiment
from tests.app.pages import chart_titled, open_page, plotly_array, small_chunked_workload


def test_page_runs_three_setups_then_a_killed_worker_is_an_inline_error(bundled, monkeypatch):
    app = open_page("disaggregated")
    assert not app.exception
    small_chunked_workload(app, "disagg")
    app.run()
    app.button(key="disagg_run").click().run()
    assert not app.exception and not app.error
    successes = " ".join(s.value for s in app.success)
    assert "Identical outputs: all 3 requests" in successes and "bit for bit" in successes

    comparison = app.session_state["results"]["disagg"]["comparison"]
    gantt = chart_titled(app, "Disaggregated: the prefill worker")
    transfers = [trace for trace in gantt["data"] if trace["name"] == "KV transfer"]
    assert len(transfers) == 3  # short-1, short-2, long: each a line from the prefill lane to the decode lane
    assert all(list(t["y"]) == ["prefill worker", "decode worker"] for t in transfers)
    assert all(plotly_array(t["x"])[0] < plotly_array(t["x"])[1] for t in transfers)
    prefill_bars = next(trace for trace in gantt["data"] if trace["name"] == "prefill step (prefill worker)")
    assert list(prefill_bars["text"]) == ["short-1 + short-2", "long"]
    latency = chart_titled(app, "Latency: one engine")
    assert [bar["name"] for bar in latency["data"]] == list(experiment.SETUPS)
    assert latency["data"][2]["y"][3] == comparison.summaries["disaggregated"].long_ttft_ms
    rows = comparison.transfer_rows()
    assert [r["bytes sent"] for r in rows] == [46080 * 8, 46080 * 8, 46080 * 64]
    caption = next(c.value for c in app.caption if "Last run" in c.value)
    assert f"{comparison.cores} cores: one engine ran on" in caption and "cpu, float32" in caption

    killing = functools.partial(experiment.run_disaggregated, fault="prefill_killed_mid_transfer")
    monkeypatch.setattr(experiment, "run_disaggregated", killing)  # real workers, the prefill one really killed
    app.button(key="disagg_run").click().run()
    assert not app.exception
    assert "The disaggregated run failed: The prefill worker died" in app.error[0].value
    assert app.session_state["results"]["disagg"]["comparison"] is comparison  # the earlier results are kept and shown
    assert chart_titled(app, "Disaggregated: the prefill worker")
    assert not multiprocessing.active_children()
