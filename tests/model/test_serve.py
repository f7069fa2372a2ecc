"""``prefillviz serve`` driven by a real client (the OpenAI SDK, and httpx for raw SSE) on 127.0.0.1, with the
bundled model: answers, streams, greedy tokens against the plain HF forward, 400s, 429s, clients that leave
mid-stream, /metrics under vLLM's names, the live record, and a clean Ctrl-C."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import openai
import pytest

from prefillviz.engine.engine import LLMEngine
from prefillviz.peers.vllm_server import free_port
from prefillviz.serve.engine_loop import EngineLoop
from prefillviz.serve.request_stream import IncrementalText
from tests.hf_oracle import hf_greedy_generate
from tests.served import server_in_thread
from tests.tolerances import assert_same_greedy_generation

MAX_NUM_SEQS = 4
PROMPT = "The three primary colours are"


@dataclass
class Served:
    url: str
    engine: LLMEngine
    loop: EngineLoop

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", timeout=120, max_retries=0)

    def metric(self, line_start: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))

    def assert_no_block_held(self) -> None:
        assert self.loop.wait_idle(60), "requests still unfinished after 60 s"
        pool = self.engine.block_pool
        assert pool.num_free_blocks == pool.num_blocks and all(b.ref_cnt == 0 for b in pool.blocks)


@pytest.fixture(scope="module")
def served(bundled):
    """The server in this process (uvicorn in a thread), so its engine's block pool can be read."""
    with server_in_thread(bundled, MAX_NUM_SEQS) as (url, engine, loop):
        yield Served(url, engine, loop)


def test_the_sdk_gets_the_same_greedy_text_streamed_or_not_with_openais_usage(served, bundled):
    client = served.client()
    whole = client.completions.create(model=bundled.model_id, prompt=PROMPT, max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(model=bundled.model_id, prompt=PROMPT, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == whole.choices[0].text and len(streamed) > 10
    assert len([c for c in chunks if c.choices]) == 12  # one event per sampled token
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason == "length"
    num_prompt = len(bundled.tokenizer(PROMPT)["input_ids"])
    for used in (whole.usage, chunks[-1].usage):
        assert (used.prompt_tokens, used.completion_tokens, used.total_tokens) == (num_prompt, 12, num_prompt + 12)
    assert whole.usage.prompt_tokens_details.cached_tokens == 0 or num_prompt >= 16


def test_chat_streams_the_templated_answer(served, bundled):
    messages = [{"role": "user", "content": "Name one colour."}]
    stream = served.client().chat.completions.create(model=bundled.model_id, messages=messages, max_tokens=8,
                                                     temperature=0, stream=True)
    deltas = [c.choices[0].delta.content for c in stream if c.choices]
    whole = served.client().chat.completions.create(model=bundled.model_id, messages=messages, max_tokens=8,
                                                    temperature=0)
    assert "".join(deltas) == whole.choices[0].message.content and whole.choices[0].message.role == "assistant"
    templated = bundled.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert whole.usage.prompt_tokens == len(templated["input_ids"])


def test_greedy_tokens_through_the_server_are_the_hf_forwards(served, bundled):
    prompt_ids = bundled.tokenizer("In 1969 the first people to walk on the Moon were")["input_ids"]
    answer = httpx.post(f"{served.url}/v1/completions", timeout=60, json={
        "prompt": prompt_ids, "max_tokens": 10, "temperature": 0, "ignore_eos": True, "return_token_ids": True}).json()
    generated = answer["choices"][0]["token_ids"]
    assert answer["prompt_token_ids"] == prompt_ids and len(generated) == 10
    assert bundled.tokenizer.decode(generated, skip_special_tokens=True) == answer["choices"][0]["text"]
    reference = hf_greedy_generate(bundled.model, prompt_ids, 10)
    assert_same_greedy_generation(bundled.model, prompt_ids, generated, reference)


def test_streamed_text_pieces_add_up_to_the_whole_decode_even_mid_character(bundled):
    tokenizer = bundled.tokenizer
    text = "Prefill → décodage 🎉🎉, 日本語 and\n\n  spaces."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [2] + list(range(40000, 40040))  # eos, then noise
    pieces = IncrementalText(tokenizer)
    streamed = "".join(pieces.add([token]) for token in ids) + pieces.flush()
    assert streamed == tokenizer.decode(ids, skip_special_tokens=True) and streamed.startswith(text)


@pytest.mark.parametrize("body, reason", [
    ({"prompt": "   "}, "The prompt is empty"),
    ({"prompt": "hi", "model": "gpt-4"}, "does not exist"),
    ({"prompt": "hi", "max_tokens": 9000}, "context of 8,192 tokens"),
    ({"prompt": [1] * 8200}, "context of 8,192 tokens"),
    ({"prompt": "hi", "temperature": -0.5}, "temperature must be in"),
    ({"prompt": "hi", "top_p": 0}, "top_p must be in"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens must be at least 1"),
    ({"prompt": "hi", "n": 2}, "n must be 1"),
    ({"prompt": [0, 10**9]}, "Token ids must lie in"),
])
def test_bad_requests_get_a_400_with_the_reason_and_the_server_goes_on(served, body, reason):
    response = httpx.post(f"{served.url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert reason in response.json()["error"]["message"]
    good = httpx.post(f"{served.url}/v1/completions", json={"prompt": "ok", "max_tokens": 2}, timeout=60)
    assert good.status_code == 200


def test_a_full_queue_answers_429_and_the_accepted_requests_finish(served):
    served.loop.max_waiting = 1
    try:
        def one(_):
            return httpx.post(f"{served.url}/v1/completions", timeout=120,
                              json={"prompt": PROMPT, "max_tokens": 32, "extra": None, "ignore_eos": True})
        with ThreadPoolExecutor(3 * MAX_NUM_SEQS) as pool:
            responses = list(pool.map(one, range(3 * MAX_NUM_SEQS)))
    finally:
        served.loop.max_waiting = 256
    statuses = sorted(r.status_code for r in responses)
    assert 429 in statuses and statuses.count(200) >= 1 and set(statuses) == {200, 429}, statuses
    refused = next(r for r in responses if r.status_code == 429).json()["error"]
    assert refused["type"] == "rate_limit_exceeded" and "queue is full" in refused["message"]
    assert all(r.json()["usage"]["completion_tokens"] == 32 for r in responses if r.status_code == 200)
    served.assert_no_block_held()


def test_ten_streams_that_hang_up_mid_answer_leave_no_block_held(served):
    aborted_before = served.metric('vllm:request_success_total{engine="0",finished_reason="abort"')

    def hang_up(_):
        body = {"prompt": f"{PROMPT} (client {_})", "max_tokens": 200, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{served.url}/v1/completions", json=body, timeout=60) as response:
            events = 0
            for line in response.iter_lines():
                events += line.startswith("data: ")
                if events == 3:
                    return events  # leaves the with-block: the connection closes mid-answer

    with ThreadPoolExecutor(10) as pool:
        assert list(pool.map(hang_up, range(10))) == [3] * 10
    served.assert_no_block_held()
    aborted = served.metric('vllm:request_success_total{engine="0",finished_reason="abort"') - aborted_before
    assert aborted == 10
    answer = httpx.post(f"{served.url}/v1/completions", timeout=60,
                        json={"prompt": "still there?", "max_tokens": 3, "ignore_eos": True})
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3


def test_metrics_use_vllms_names_and_count_the_requests(served):
    before = served.metric("vllm:time_to_first_token_seconds_count")
    shared = "A shared preamble that several requests repeat word for word, long enough for whole blocks. " * 3
    for tail in ("First.", "Second."):
        httpx.post(f"{served.url}/v1/completions", json={"prompt": shared + tail, "max_tokens": 2}, timeout=60)
    text = httpx.get(f"{served.url}/metrics", timeout=10).text
    for name in ("vllm:time_to_first_token_seconds_bucket", "vllm:request_queue_time_seconds_sum",
                 "vllm:request_prefill_time_seconds_count", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert name in text, name
    assert served.metric("vllm:time_to_first_token_seconds_count") == before + 2
    assert served.metric("vllm:prefix_cache_hits_total") >= 16  # the second request hit the first's blocks


def test_the_live_record_splits_each_ttft_into_parts_that_add_up(served):
    httpx.post(f"{served.url}/v1/completions", json={"prompt": PROMPT * 20, "max_tokens": 4}, timeout=60)
    live = httpx.get(f"{served.url}/prefillviz/steps", timeout=10).json()
    assert live["steps"] and live["token_budget"] == 256
    assert all(sum(c[1] for c in step["chunks"]) <= 256 for step in live["steps"])
    finished = [r for r in live["requests"] if r["ttft_s"] is not None]
    assert finished
    for r in finished:
        parts = r["queue_s"] + r["rode_s"] + r["sat_out_s"] + r["between_steps_s"]
        assert parts == pytest.approx(r["ttft_s"], abs=1e-9) and r["rode_s"] > 0 and r["num_prefill_steps"] >= 1
    fraction = live["recording_cost_fraction"]  # how small it is is a figure to print, not a unit test's bound
    assert fraction is not None and math.isfinite(fraction) and fraction > 0, fraction
    later = httpx.get(f"{served.url}/prefillviz/steps", params={"since": live["num_steps"]}, timeout=10).json()
    assert later["steps"] == [] and later["num_reads"] == live["num_reads"] + 1 and later["read_cost_s"] > 0


def test_our_probe_reads_the_server_as_it_reads_vllm(served):
    """probe-server (the Your server page's probe) on its prefix experiment: the server reports the hit in
    ``usage`` and counts it under vLLM's counter names, whole 16-token blocks of the 256-token prefix."""
    command = [sys.executable, "-m", "prefillviz", "probe-server", "--url", f"{served.url}/v1", "--json",
               "--experiments", "prefix", "--sizes", "64", "--runs", "1", "--prefix-tokens", "256"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    probe = json.loads(done.stdout)
    assert probe["server"]["metrics_available"] and probe["server"]["max_model_len"] == 8192
    cached = probe["cached_tokens_reported"]
    assert cached % 16 == 0 and 192 <= cached <= 256 + 16, cached
    assert probe["metrics_delta"]["prefix"]["vllm:prefix_cache_hits_total"] >= cached


def test_ctrl_c_stops_the_command_cleanly(bundled):  # bundled: the command serves it (and is marked so)
    port = free_port()
    command = [sys.executable, "-m", "prefillviz", "serve", "--port", str(port), "--max-num-seqs", "2"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "serve did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        body = {"prompt": PROMPT, "max_tokens": 3}
        assert json.loads(httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60).text)["usage"]
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, output[-2000:]
    assert "KV blocks still held by a request: 0" in output and "Traceback" not in output


def test_the_live_engine_page_draws_the_servers_steps_and_says_what_recording_cost(served):
    from tests.app.pages import chart_titled, open_page

    httpx.post(f"{served.url}/v1/completions", json={"prompt": PROMPT * 10, "max_tokens": 4}, timeout=60)
    app = open_page("live_engine")
    app.text_input(key="live_url").set_value(served.url).run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    budget = chart_titled(app, "Each step's token budget")
    assert budget["data"][-1]["name"] == "token budget" and len(budget["data"]) >= 2
    assert chart_titled(app, "KV blocks")["data"][0]["name"] == "blocks in use"
    split = chart_titled(app, "Time to first token of each finished request")
    assert [d["name"] for d in split["data"]][0].startswith("queue")
    assert any("Recording these steps cost the engine" in c.value for c in app.caption)
    app.text_input(key="live_url").set_value("http://127.0.0.1:9").run()  # nobody listens there
    assert not app.exception and any("Can't reach http://127.0.0.1:9" in e.value for e in app.error)


def test_a_bad_option_or_a_taken_port_is_one_error_line_before_the_model_loads(served):
    taken = served.url.rsplit(":", 1)[1]
    for options, message in ((["--port", "70000"], "--port must be in 0..65535"),
                             (["--port", taken], f"Can't listen on 127.0.0.1:{taken}"),
                             (["--token-budget", "0"], "token_budget must be a positive whole number")):
        done = subprocess.run([sys.executable, "-m", "prefillviz", "serve", *options], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2 and done.stderr.startswith(f"error: {message}"), done.stderr[-1000:]
        assert "loading" not in done.stderr
