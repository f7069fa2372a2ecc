"""vLLM's own benchmark client (``vllm bench serve`` from .venv-vllm, ``--backend openai``, a random dataset
at a Poisson request rate) against ``python -m prefillviz serve`` with the bundled model: every request
succeeds, every token arrives, the block pool ends all free, and the client's TTFT agrees with the server's.

Both of the client's runs (``--backend openai-chat``, then ``openai``) go to one start of our server from one client
process (``run_bench_serves``): the client's imports take ~8 s on 2 cores, more than the chat run itself."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import httpx
import pytest

from prefillviz.loading import bundled as bundled_files
from prefillviz.peers.vllm_bench import bench_serve_command, run_bench_serves
from prefillviz.peers.vllm_server import free_port
from prefillviz.probe.live import fetch_live, recording_cost

NUM_PROMPTS, REQUEST_RATE, INPUT_LEN, OUTPUT_LEN = 20, 2.0, 256, 32


@pytest.fixture(scope="module")
def our_server(bundled):  # bundled: its first load writes the tokenizer folder the client reads
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "prefillviz", "serve", "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None and time.monotonic() < deadline, "serve did not start within 180 s"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=30)
    assert "KV blocks still held by a request: 0" in output, output[-2000:]


@pytest.fixture(scope="module")
def bench_runs(needs_vllm, our_server, bundled):
    """Each backend's run, by name. The chat run goes first, so the completions run's requests are the last ones
    the server's live record holds when its test reads it."""
    model = httpx.get(f"{our_server}/v1/models", timeout=10).json()["data"][0]["id"]
    tokenizer = bundled_files.bundled_cache_dir()
    chat = bench_serve_command(our_server, model, tokenizer, NUM_PROMPTS // 2, REQUEST_RATE, INPUT_LEN, OUTPUT_LEN,
                               backend="openai-chat", seed=1)
    completions = bench_serve_command(our_server, model, tokenizer, NUM_PROMPTS, REQUEST_RATE, INPUT_LEN, OUTPUT_LEN,
                                      seed=0)
    chat_run, completions_run = run_bench_serves([chat, completions], timeout_s=900)
    return {"openai-chat": chat_run, "openai": completions_run}


def test_vllm_bench_serve_completes_every_request_and_its_ttft_is_ours(bench_runs, our_server):
    run = bench_runs["openai"]
    print(run.table)
    result = run.result
    assert (result["completed"], result["failed"]) == (NUM_PROMPTS, 0), run.output[-3000:]
    assert result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN  # --ignore-eos: every token it asked for
    assert result["total_input_tokens"] == NUM_PROMPTS * INPUT_LEN
    # the server's own TTFT of the same requests (the live record keeps each one's, from the engine's clock)
    fetch_live(our_server)  # one read before, so the cost of reading is measured too
    live = fetch_live(our_server)
    print(recording_cost(live).sentence())
    ours = [r["ttft_s"] * 1000 for r in live["requests"][-NUM_PROMPTS:]]
    ours_p50, theirs_p50 = statistics.median(ours), result["median_ttft_ms"]
    print(f"TTFT p50: vllm bench serve {theirs_p50:.1f} ms, the server's own {ours_p50:.1f} ms")
    assert ours_p50 <= theirs_p50 * 1.02 + 1  # the client's includes the HTTP round trip
    assert theirs_p50 - ours_p50 <= max(0.1 * theirs_p50, 20.0)  # within 10% (or 20 ms of HTTP on a loaded CPU)


def test_vllm_bench_serve_chat_completes_every_request(bench_runs):
    """``--backend openai-chat``: the same client on /v1/chat/completions (the prompt through the chat template)."""
    run = bench_runs["openai-chat"]
    print(run.table)
    assert (run.result["completed"], run.result["failed"]) == (NUM_PROMPTS // 2, 0), run.output[-3000:]
    assert run.result["total_output_tokens"] == NUM_PROMPTS // 2 * OUTPUT_LEN
    assert run.result["total_input_tokens"] > NUM_PROMPTS // 2 * INPUT_LEN  # the template's tokens, from usage
