"""The probe against servers that are not what it hoped for: nothing listening, a web page that
is not an OpenAI API, junk in the stream, a server that stalls; and the bounds and the hosted
allow-list. Each bad server is a real HTTP server on 127.0.0.1 (``http.server``), not a mock."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from prefillviz.engine.errors import ConfigError
from prefillviz.loading.hosted import HostedPolicy
from prefillviz.probe.client import ProbeBudget, ProbeError, ServerClient, normalized_url
from prefillviz.probe.metrics import MetricsDelta, parse_metrics
from prefillviz.probe.report import ProbeSettings, planned_sizes, probe_server

MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 512}]}


def serve(routes: dict):
    """A real HTTP server whose GET/POST answers are ``routes[path](handler)``; yields its URL."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self):
            length = int(self.headers.get("content-length") or 0)
            self.body = self.rfile.read(length) if length else b""
            route = routes.get(self.path)
            if route is None:
                self.send_response(404)
                self.end_headers()
                return
            try:
                route(self)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the probe hung up first, as it should on a stalled server

        do_GET = do_POST = answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def send(handler, status: int, body: bytes, content_type: str = "application/json"):
    handler.send_response(status)
    handler.send_header("content-type", content_type)
    handler.send_header("content-length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def models(handler):
    send(handler, 200, json.dumps(MODELS).encode())


def usage(handler):
    send(handler, 200, json.dumps({"choices": [{"text": "x"}], "usage": {"prompt_tokens": 206}}).encode())


@pytest.fixture
def bad_server(request):
    server = serve(request.param)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_nothing_listening_is_said_in_words():
    with pytest.raises(ProbeError, match="Could not reach http://127.0.0.1:9 .*Is the server running"):
        probe_server("http://127.0.0.1:9")


@pytest.mark.parametrize("bad_server", [{"/": lambda h: send(h, 200, b"<html>hello</html>", "text/html")}],
                         indirect=True)
def test_a_web_page_without_the_api_is_not_openai_compatible(bad_server):
    with pytest.raises(ProbeError, match="no /v1/models .*not an OpenAI-compatible server"):
        probe_server(bad_server)


@pytest.mark.parametrize("bad_server", [{"/v1/models": lambda h: send(h, 200, b"<html>login</html>", "text/html")}],
                         indirect=True)
def test_a_page_that_is_not_json_is_named(bad_server):
    with pytest.raises(ProbeError, match="not JSON .*<html>login"):
        probe_server(bad_server)


@pytest.mark.parametrize("bad_server", [{"/v1/models": models}], indirect=True)
def test_a_wrong_model_name_lists_what_it_serves(bad_server):
    with pytest.raises(ProbeError, match="does not serve 'other'; it serves: m"):
        probe_server(bad_server, "other")


def junk_stream(handler):
    handler.send_response(200)
    handler.send_header("content-type", "text/event-stream")
    handler.end_headers()
    handler.wfile.write(b"data: {not json at all\n\n")


@pytest.mark.parametrize("bad_server", [{
    "/v1/models": models,
    "/v1/completions": lambda h: junk_stream(h) if json.loads(h.body).get("stream") else usage(h),
}], indirect=True)
def test_junk_in_the_stream_is_an_error_not_a_crash(bad_server):
    with pytest.raises(ProbeError, match="streamed junk, not JSON"):
        probe_server(bad_server, settings=ProbeSettings(sizes=(16, 32, 64), runs=1))


def stall(handler):
    time.sleep(6)
    usage(handler)


@pytest.mark.parametrize("bad_server", [{"/v1/models": models, "/v1/completions": stall}], indirect=True)
def test_a_stalled_server_times_out_within_the_read_timeout(bad_server):
    started = time.monotonic()
    with pytest.raises(ProbeError, match="stalled: no answer within 1 s"):
        probe_server(bad_server, read_timeout_s=1.0)
    assert time.monotonic() - started < 5


def test_the_budget_stops_before_going_over():
    budget = ProbeBudget(max_requests=2, max_prompt_tokens=100)
    budget.spend(40, 1)
    with pytest.raises(ProbeError, match=r"prompt tokens \(140 > 100\)"):
        budget.spend(100, 1)
    budget.spend(10, 1)
    with pytest.raises(ProbeError, match=r"requests \(3 > 2\)"):
        budget.spend(1, 1)
    assert (budget.num_requests, budget.num_prompt_tokens) == (2, 50)


def test_urls_are_normalized_and_non_http_refused():
    assert normalized_url(" http://h:8000/v1/ ") == "http://h:8000"
    assert normalized_url("https://h/proxy/v1") == "https://h/proxy"
    for bad in ("ftp://h", "h:8000", "", "file:///etc/passwd"):
        with pytest.raises(ProbeError, match="not a server URL"):
            ServerClient(bad)


def test_hosted_mode_probes_only_the_allow_list():
    HostedPolicy(enabled=False).check_probe_url("http://10.0.0.1:80")  # on your own machine: any URL
    with pytest.raises(ConfigError, match="off in this hosted demo"):
        HostedPolicy(enabled=True).check_probe_url("http://127.0.0.1:8000")
    allowed = HostedPolicy(enabled=True, allowed_probe_urls=("http://10.1.2.3:8000",))
    allowed.check_probe_url("http://10.1.2.3:8000/v1")
    with pytest.raises(ConfigError, match="probes only http://10.1.2.3:8000"):
        allowed.check_probe_url("http://169.254.169.254/latest")
    assert allowed.limit("probe_requests", 200) == 60


def test_sizes_fit_the_context_and_metrics_deltas_split_counters_from_gauges():
    assert planned_sizes(ProbeSettings(), 512) == [64, 128, 256]
    assert planned_sizes(ProbeSettings(sizes=(32, 4096)), 2048) == [32]
    with pytest.raises(ProbeError, match="No prompt size fits"):
        planned_sizes(ProbeSettings(sizes=(4096,)), 1024)
    text = 'vllm:prefix_cache_hits_total{model_name="m"} %d\nvllm:num_requests_running{model_name="m"} %d\n'
    delta = MetricsDelta.between(parse_metrics(text % (10, 0)), parse_metrics(text % (42, 3)))
    assert delta.counters == {"vllm:prefix_cache_hits_total": 32.0}
    assert delta.gauges == {"vllm:num_requests_running": (0.0, 3.0)}
    with pytest.raises(ProbeError, match="not Prometheus text"):
        parse_metrics("this is { not prometheus")
