"""The side-by-side of our server and ``vllm serve`` (``measure.serve_side_by_side``) from canned sweeps:
the rows per load, a load one sweep never reached, the knees (one below the loads swept), the verdict,
and the machine's load."""

from dataclasses import asdict

import pytest

from prefillviz.measure.serve_knees import comparison, knee_of
from prefillviz.measure.serve_side_by_side import ServerLimits
from prefillviz.measure.serve_side_by_side_table import side_by_side_table
from prefillviz.probe.load import PointRun, RequestRecord
from prefillviz.probe.load_stats import PointResult
from prefillviz.probe.load_sweep import LoadReport, LoadSettings

SETTINGS = LoadSettings(mode="rate", loads=(0.5, 1.0, 2.0, 4.0), requests_per_point=6)
MACHINE = {"loadavg_1min_before": 1.5, "loadavg_1min_after": 2.25, "num_cpus": 2, "wall_s": 40.0,
           "server_cpu_percent": 70.0, "client_cpu_percent": 4.0, "other_cpu_percent": 31.0, "busy": True}


def point(load, ttft_p99_s, requests_per_s, waiting_s=None, prefill_s=None):
    split_known = waiting_s is not None
    return {
        "load": load, "requests_sent": 6, "requests_ok": 6, "errors": 0, "first_error": None,
        "requests_per_s": requests_per_s, "output_tokens_per_s": 8 * requests_per_s, "prompt_tokens_per_s": 0.0,
        "ttft_s_p50": ttft_p99_s / 2, "ttft_s_p90": ttft_p99_s, "ttft_s_p99": ttft_p99_s, "itl_s_p50": 0.05,
        "itl_s_p99": 0.1, "goodput_share": 1.0, "gauge_peaks": {},
        "split": {"waiting_s_mean": waiting_s, "queue_s_mean": waiting_s, "prefill_s_mean": prefill_s,
                  "server_ttft_s_mean": (waiting_s + prefill_s) if split_known else None,
                  "queue_share": waiting_s / (waiting_s + prefill_s) if split_known else None,
                  "missing": [] if split_known else ["/metrics (the server has none)"]},
    }


def server(points, knee, version, machine=MACHINE, error=None, stopped_reason=None):
    return {"command": [], "pid": None, "start_s": 12.0, "error": error, "server": {"version": version},
            "one_at_a_time_rate": 3.0, "load_points": points, "knee": knee, "stopped_reason": stopped_reason,
            "reading": "", "sweep_s": 40.0, "machine": machine}


def result(ours, vllm):
    servers = {"ours": ours, "vllm": vllm}
    return {"limits": asdict(ServerLimits()), "settings": asdict(SETTINGS), "servers": servers,
            "comparison": comparison(servers)}


OURS = server(
    [point(0.5, 0.100, 0.48, 0.002, 0.090), point(1.0, 0.120, 0.97, 0.004, 0.100),
     point(2.0, 0.180, 1.90, 0.010, 0.120), point(4.0, 0.900, 3.10, 0.600, 0.200)],
    {"load": 2.0, "reached": True, "below_sweep": False, "requests_per_s": 1.90, "output_tokens_per_s": 15.2,
     "ttft_s_p99": 0.180},
    "prefillviz 0.1",
)
VLLM = server(
    [point(0.5, 0.080, 0.49), point(1.0, 0.150, 0.95), point(2.0, 0.400, 1.70)],
    {"load": 1.0, "reached": True, "below_sweep": False, "requests_per_s": 0.95, "output_tokens_per_s": 7.6,
     "ttft_s_p99": 0.150},
    "0.32.0", stopped_reason="Past the knee: heavier loads were not sent.",
)


def test_each_load_has_a_row_per_server_with_its_throughput_ttft_and_split():
    lines = side_by_side_table(result(OURS, VLLM)).splitlines()
    row = next(i for i, line in enumerate(lines) if line.strip().startswith("2 "))
    ours, vllm = lines[row].split(), lines[row + 1].split()
    assert ours == ["2", "ours", "6/6", "1.90", "15.2", "90", "180", "10", "120", "8%"]
    assert vllm == ["vllm", "6/6", "1.70", "13.6", "200", "400", "—", "—", "—"]  # no split: shown as missing
    last = next(i for i, line in enumerate(lines) if line.strip().startswith("4 "))
    assert "vllm    not swept" in lines[last + 1]  # its sweep stopped past the knee


def test_the_knees_the_verdict_and_the_machine_load_are_printed():
    text = side_by_side_table(result(OURS, VLLM))
    assert "  ours: 2 req/s: 1.90 req/s, 15.2 out tok/s achieved, TTFT p99 180 ms" in text
    assert "  vllm: 1 req/s: 0.95 req/s" in text
    assert "ours' throughput at the knee is at least vllm's: yes" in text
    assert "(req/s achieved at the knees, ours / vllm: 2.00×)" in text
    assert "load average 1.50 → 2.25" in text and "other processes 31% of the 2 cores" in text and "(busy" in text
    assert "vllm stopped reason: Past the knee" in text
    assert "(ours: prefillviz 0.1, vllm: 0.32.0)" in text


def test_the_verdict_compares_the_req_s_achieved_at_each_knee_and_flags_a_knee_not_reached():
    behind = {**OURS, "knee": {**OURS["knee"], "load": 0.5, "requests_per_s": 0.48}}
    assert comparison({"ours": behind, "vllm": VLLM})["ours_at_least_vllm_at_knee"] is False
    unreached = {**VLLM, "knee": {**VLLM["knee"], "load": 2.0, "reached": False, "requests_per_s": 1.70}}
    verdict = comparison({"ours": OURS, "vllm": unreached})
    assert verdict["ours_at_least_vllm_at_knee"] is True and verdict["both_knees_reached"] is False
    text = side_by_side_table(result(OURS, unreached))
    assert "  vllm: 2 req/s or more (no heavier load went past it)" in text
    assert "a knee not reached is a lower bound" in text


def sweep(points_by_load: dict[float, tuple[list[float], list[float]]]) -> LoadReport:
    """A finished rate sweep: per load, when each request was sent and when its answer ended (s)."""
    report = LoadReport(server={}, settings=LoadSettings(mode="rate", loads=tuple(points_by_load)))
    for load, (sent, ended) in points_by_load.items():
        records = [RequestRecord(sent_s=s, target_tokens=256, shared_prefix=False, time_to_first_token_s=(e - s) / 2,
                                 output_tokens=8, end_s=e) for s, e in zip(sent, ended)]
        report.points.append(PointResult("rate", load, PointRun(records, max(ended) - min(sent), {})))
    return report


def steady(load: float, latency_s: float, num: int = 12) -> tuple[list[float], list[float]]:
    sent = [i / load for i in range(num)]
    return sent, [s + latency_s for s in sent]


def test_a_server_that_kept_up_has_the_probes_knee():
    knee = knee_of(sweep({0.5: steady(0.5, 0.3), 1.0: steady(1.0, 0.3), 2.0: steady(2.0, 0.5), 4.0: steady(4.0, 2.0)}))
    assert (knee["load"], knee["reached"], knee["below_sweep"]) == (2.0, True, False)  # 4 req/s: p99 past 2×
    assert knee["requests_per_s"] == pytest.approx(12 / (11 / 2.0 + 0.5))
    burst = knee_of(sweep({1.0: ([0.0, 0.3], [0.5, 0.8])}))  # 2 requests 0.3 s apart, served at once: kept up
    assert burst["below_sweep"] is False


def test_a_server_that_fell_behind_at_the_lightest_load_has_its_knee_below_the_sweep():
    """As vLLM on a busy 2-core machine: sent every 2 s, answered every 3.5 s; TTFT p99 grows little past it,
    so the probe's relative knee alone would put the knee at the heaviest load."""
    behind = ([2.0 * i for i in range(12)], [3.5 * (i + 1) for i in range(12)])
    heavier = ([0.5 * i for i in range(12)], [3.0 * (i + 1) for i in range(12)])
    knee = knee_of(sweep({0.5: behind, 2.0: heavier}))
    assert knee["below_sweep"] and knee["load"] is None and knee["served_most_at"] == 2.0
    assert knee["requests_per_s"] == pytest.approx(12 / 36)
    servers = result(OURS, {**VLLM, "knee": knee})["servers"]
    assert comparison(servers)["ours_at_least_vllm_at_knee"] is True
    assert "  vllm: below the loads swept (it did not keep up with the lightest, 0.5 req/s); the most it served, " \
           "at 2 req/s: 0.33 req/s" in side_by_side_table(result(OURS, {**VLLM, "knee": knee}))


def test_a_server_that_did_not_start_is_an_error_line_and_no_verdict():
    failed = server([], None, None, machine=None, error="VLLMUnavailable: vllm serve did not answer within 240 s")
    text = side_by_side_table(result(OURS, failed))
    assert comparison({"ours": OURS, "vllm": failed})["ours_at_least_vllm_at_knee"] is None
    assert "no verdict (a sweep is missing)" in text
    assert "vllm error: VLLMUnavailable: vllm serve did not answer" in text
    assert "  vllm: not measured" in text and "  vllm: none (no load point finished)" in text
