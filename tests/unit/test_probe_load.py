"""The load sweep against a small real HTTP server on 127.0.0.1 that behaves like one engine:
one prefill at a time behind a lock (so requests queue when they arrive faster than it
prefills), then a few streamed tokens. It times its own queue waits and prefills into real
``prometheus_client`` histograms under vLLM's names, so the split can be checked against
what it measured. Variants fail mid-sweep, have no /metrics, or are stopped."""

import asyncio
import json
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from prefillviz.probe.client import ProbeBudget, ProbeError, ServerClient
from prefillviz.probe.load import PlannedRequest, PointRun, RequestRecord, arrival_times_s, run_point
from prefillviz.probe.load_stats import PointResult, find_knee, reading
from prefillviz.probe.load_sweep import LoadSettings, load_sweep
from tests.unit.test_probe_faults import models, send, serve

PREFILL_S, GAP_S = 0.1, 0.005
BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0)


class OneEngine:
    """The server's state: the prefill lock, its histograms, and how each stream ended."""

    def __init__(self, fail_after: int | None = None, metrics: bool = True, num_gaps_s: float = GAP_S):
        self.lock = threading.Lock()
        self.registry = CollectorRegistry()
        self.queue = Histogram("vllm:request_queue_time_seconds", "queue", registry=self.registry, buckets=BUCKETS)
        self.prefill = Histogram("vllm:request_prefill_time_seconds", "prefill", registry=self.registry,
                                 buckets=BUCKETS)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "ttft", registry=self.registry, buckets=BUCKETS)
        self.fail_after, self.gap_s = fail_after, num_gaps_s
        self.num_streams = self.num_finished = self.num_hung_up = 0
        self.num_posts = 0
        routes = {"/v1/models": models, "/v1/completions": self.completions}
        if metrics:
            routes["/metrics"] = lambda h: send(h, 200, generate_latest(self.registry), "text/plain; version=0.0.4")
        self.server = serve(routes)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def completions(self, handler):
        self.num_posts += 1
        body = json.loads(handler.body)
        prompt_tokens = len(body["prompt"].split()) + 6
        if not body.get("stream"):
            send(handler, 200,
                 json.dumps({"choices": [{"text": "x"}], "usage": {"prompt_tokens": prompt_tokens}}).encode())
            return
        self.num_streams += 1
        if self.fail_after is not None and self.num_streams > self.fail_after:
            send(handler, 500, b'{"error": "engine dead"}')
            return
        arrived = time.perf_counter()
        try:
            with self.lock:  # one prefill at a time: later arrivals wait here
                scheduled = time.perf_counter()
                time.sleep(PREFILL_S)
            handler.send_response(200)
            handler.send_header("content-type", "text/event-stream")
            handler.end_headers()
            first = time.perf_counter()
            self.queue.observe(scheduled - arrived)
            self.prefill.observe(first - scheduled)
            self.ttft.observe(first - arrived)
            for index in range(body["max_tokens"]):
                if index:
                    time.sleep(self.gap_s)
                handler.wfile.write(b'data: {"choices": [{"text": "a", "finish_reason": null}]}\n\n')
                handler.wfile.flush()
            usage = {"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": body["max_tokens"]}}
            handler.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            handler.wfile.flush()
            self.num_finished += 1
        except (BrokenPipeError, ConnectionResetError):
            self.num_hung_up += 1  # the client closed the stream
            raise

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine(request):
    server = OneEngine(**getattr(request, "param", {}))
    yield server
    server.close()


def quick(**changes) -> LoadSettings:
    return LoadSettings(**{"requests_per_point": 8, "prompt_tokens": 32, "output_tokens": 4, "max_seconds": 60,
                           **changes})


def test_ttft_p99_and_the_queue_share_rise_with_load_and_the_split_matches_the_client(engine):
    report = load_sweep(engine.url, settings=quick(loads=(4.0, 80.0)))
    low, high = (p.to_json(1.0, 0.25) for p in report.points)
    assert report.stopped_reason is None and [p.load for p in report.points] == [4.0, 80.0]
    assert high["ttft_s_p99"] > 2 * low["ttft_s_p99"], (low, high)  # 8 arrivals at once queue behind one prefill lock
    assert high["split"]["queue_share"] > low["split"]["queue_share"] + 0.3
    for point in (low, high):
        assert point["requests_ok"] == 8 and point["errors"] == 0
        assert point["split"]["missing"] == []
        # this server's TTFT is its queue + prefill exactly; the client's adds HTTP and this process's threads
        split = point["split"]
        assert (split["before_scheduler_s_mean"] == pytest.approx(0.0, abs=0.005)
                and 0.3 < split["split_over_client"] < 1.05), split
        assert split["waiting_s_mean"] == pytest.approx(split["queue_s_mean"] + split["before_scheduler_s_mean"])
        assert point["split"]["prefill_s_mean"] == pytest.approx(PREFILL_S, rel=0.5)
        assert point["output_tokens_per_s"] > 0 and point["itl_s_p50"] < 0.1
    result = report.to_json()
    assert result["knee_load"] == 4.0 and result["knee_reached"]
    assert "Up to 4 req/s your TTFT is mostly prefill; beyond it, it is the queue" in result["reading"]


@pytest.mark.parametrize("engine", [{"metrics": False}], indirect=True)
def test_closed_loop_goodput_falls_when_users_queue_and_metrics_are_missing(engine):
    report = load_sweep(engine.url, settings=quick(mode="concurrency", loads=(1, 8), ttft_target_s=0.25))
    one, eight = (p.to_json(0.25, 0.25) for p in report.points)
    # 1 user: TTFT ≈ one 100 ms prefill; 8 users: the k-th waits for k - 1 prefills, so most take over 250 ms
    assert (one["goodput_share"] >= 0.75 and eight["goodput_share"] <= 0.5
            and one["goodput_share"] > eight["goodput_share"] + 0.4), (one, eight)
    assert eight["ttft_s_p50"] > 2 * one["ttft_s_p50"]
    assert one["split"]["queue_s_mean"] is None and one["split"]["missing"] == ["/metrics (the server has none)"]
    assert "can't be split into queue and prefill" in report.reading()


@pytest.mark.parametrize("engine", [{"fail_after": 3 + 8 + 2}], indirect=True)  # the warm-up, one point, then 500s
def test_a_server_that_starts_failing_stops_the_sweep_and_keeps_the_points_before(engine):
    started = time.monotonic()
    report = load_sweep(engine.url, settings=quick(loads=(8.0, 16.0, 32.0)))
    assert [p.load for p in report.points] == [8.0]
    assert "The server started failing at load 16" in report.stopped_reason and "HTTP 500" in report.stopped_reason
    assert "engine dead" in report.stopped_reason and "the 1 load point(s) before it are kept" in report.stopped_reason
    assert engine.num_streams < 3 + 8 + 8  # it stopped sending at the first errors, not after the whole point
    assert time.monotonic() - started < 20


def test_a_stop_closes_every_stream_in_flight(engine):
    engine.gap_s = 0.1  # long answers: several streams are open when the stop comes
    started = time.monotonic()
    report = load_sweep(engine.url, settings=quick(loads=(40.0,), output_tokens=20),
                        should_stop=lambda: engine.num_streams >= 3 + 5)
    assert report.points == [] and "Stopped by the user during load 40" in report.stopped_reason
    assert time.monotonic() - started < 4 * 20 * 0.1  # the three warm-ups, not the point's answers
    deadline = time.monotonic() + 10
    while engine.num_finished + engine.num_hung_up < engine.num_streams and time.monotonic() < deadline:
        time.sleep(0.05)  # each handler notices the closed stream at its next write
    # only the warm-ups were read to the end
    assert engine.num_finished == 3 and engine.num_hung_up == engine.num_streams - 3 >= 5


def test_the_plan_is_refused_before_anything_is_sent_when_over_its_bounds(engine):
    with pytest.raises(ProbeError, match=r"would go over its bounds: requests \(52 > 20\)"):
        load_sweep(engine.url, settings=quick(loads=(1.0, 2.0, 4.0, 8.0, 16.0, 32.0)),
                   budget=ProbeBudget(max_requests=20))
    assert engine.num_posts == 0
    with pytest.raises(ProbeError, match="Impossible load settings.*knee factor above 1"):
        load_sweep(engine.url, settings=quick(knee_factor=0.5))


def point(load: float, ttfts: list[float]) -> PointResult:
    records = [RequestRecord(sent_s=0.0, target_tokens=10, shared_prefix=False, time_to_first_token_s=t, end_s=t)
               for t in ttfts]
    return PointResult("rate", load, PointRun(records, 1.0, {}))


def test_the_knee_is_the_last_load_within_the_factor_of_the_low_load_p99():
    points = [point(1, [0.1, 0.1]), point(2, [0.1, 0.15]), point(4, [0.1, 0.19]), point(8, [0.2, 0.5])]
    assert find_knee(points, 2.0) == (2, True)
    assert find_knee(points[:3], 2.0) == (2, False)  # nothing went past: no knee within the loads
    assert "no knee within the loads swept" in reading(points[:3], 2.0)
    times = arrival_times_s(10.0, 2000, seed=1)
    assert times[0] == 0 and times == sorted(times) and 1900 / 10 < times[-1] < 2100 / 10  # Poisson: mean gap 1/rate


def test_the_command_line_prints_each_points_percentiles_goodput_split_and_the_knee(engine, capsys):
    from prefillviz.cli import main

    argv = ["probe-server", "--url", engine.url, "--load", "rate", "--loads", "4,80", "--requests-per-point", "8",
            "--prompt-tokens", "32", "--output-tokens", "4", "--ttft-target-ms", "300"]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["knee_load"] == 4.0 and [p["load"] for p in result["load_points"]] == [4.0, 80.0]
    for point in result["load_points"]:
        assert {"ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "itl_s_p50", "itl_s_p99", "goodput_share",
                "requests_per_s"} <= set(point)
        assert point["split"]["queue_s_mean"] is not None and point["split"]["prefill_s_mean"] > 0
    assert result["load_points"][0]["goodput_share"] > result["load_points"][1]["goodput_share"]
    assert main(argv) == 0  # the table for people
    printed = capsys.readouterr().out
    assert "knee: 4.0" in printed and "wait share" in printed and "your TTFT is mostly prefill" in printed


def test_prompts_follow_the_length_distribution_and_the_shared_prefix_share():
    import random

    from prefillviz.probe.load_sweep import plan_requests
    from prefillviz.probe.prompts import PromptMaker

    settings = LoadSettings(prompt_tokens=200, prompt_spread=0.5, shared_prefix_share=0.5, shared_prefix_tokens=64)
    maker = PromptMaker(1.0, seed=3)
    shared = maker.prompt(64)
    plan = plan_requests(settings, maker, shared, random.Random(3), 400)
    with_prefix = [r for r in plan if r.shared_prefix]
    assert 0.4 < len(with_prefix) / len(plan) < 0.6
    assert (all(r.prompt.startswith(shared) for r in with_prefix)
            and not any(r.prompt.startswith(shared) for r in plan if not r.shared_prefix))
    lengths = [r.target_tokens for r in plan]
    assert 100 <= min(lengths) < 110 and 290 < max(lengths) <= 300  # uniform in 200 × [0.5, 1.5]
    assert len({r.prompt for r in plan}) == len(plan)  # each suffix is its own: only the shared prefix is shared


# streams of 3 s: most of the point is spent waiting on them
@pytest.mark.parametrize("engine", [{"num_gaps_s": 0.2}], indirect=True)
def test_waiting_on_the_streams_leaves_the_cpu_to_the_server(engine, monkeypatch):
    """The probe shares the machine with the server it measures (2 cores here): while its requests stream,
    it must sleep, not spin. A loop that waited on already-finished tasks once took a whole core.

    Counted, not timed, so it holds on any CPU: the wait loop wakes when a request finishes or after
    its 20 ms poll, so a point of ``wall`` seconds allows at most wall / 20 ms wake-ups plus one per
    request; the spinning loop woke thousands of times a second."""
    waits, real_wait = [], asyncio.wait

    async def counted(*args, **kwargs):
        waits.append(1)
        return await real_wait(*args, **kwargs)

    monkeypatch.setattr(asyncio, "wait", counted)
    plan = [PlannedRequest("a b c d", 10, False)] * 8
    with ServerClient(engine.url) as client:
        wall = time.perf_counter()
        run = run_point(client, "tiny", "rate", 8.0, plan, 16, max_errors=0, deadline_s=60, request_deadline_s=30,
                        seed=0, poll_metrics=False, should_stop=lambda: False, on_done=lambda record: None)
        wall = time.perf_counter() - wall
    assert sum(r.ok for r in run.records) == 8
    assert len(waits) <= wall / 0.02 + len(plan), f"{len(waits)} wake-ups in {wall:.2f} s"
