"""The Live engine page's Send (probe/send.py) against a stub OpenAI server on 127.0.0.1: the answer streams in the
background with the user's tag on the request, a 429, a 400 or an unreachable server is one sentence, a session
has at most so many sends running, and every send ends."""

import asyncio
import json
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from prefillviz.engine.errors import ProbeError
from prefillviz.experiments.class_burst import STUDENT_MAX_NEW_TOKENS
from prefillviz.peers.vllm_server import free_port
from prefillviz.probe.send import Sends
from prefillviz.serve.openai_format import error_body

BODIES = []  # what the stub was sent


async def models(_):
    return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "x"}]})


def chunk(text: str | None, finish: str | None = None) -> str:
    body = {"id": "chatcmpl-abc123", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n"


async def chat(request):
    body = await request.json()
    BODIES.append(body)
    prompt = body["messages"][0]["content"]
    if prompt == "full":
        return JSONResponse(error_body(429, "The server's queue is full (4 requests waiting, at most 4); retry later."),
                            status_code=429)
    if prompt == "bad":
        return JSONResponse(error_body(400, "The prompt is too long for the model's context.", "prompt"), 400)

    async def events():
        if prompt == "slow":
            await asyncio.sleep(1.0)
        yield chunk("Hel")
        yield chunk("lo")
        yield chunk(None, "length")
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def stub_url():
    port = free_port()
    app = Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the stub server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(20)


def test_a_send_streams_its_answer_in_the_background_tagged_with_its_user(stub_url):
    sends = Sends()
    sent = sends.send(f"{stub_url}/v1", "Why is the sky blue?", "student 7")
    assert sent.error is None and sends.wait_all(20)
    assert sent.text == "Hello" and sent.request_id == "chatcmpl-abc123" and sent.first_token_s > 0
    assert sends.own_request_ids() == {"chatcmpl-abc123"}  # the figures star it
    body = BODIES[-1]
    assert body["user"] == "student 7" and body["stream"] and body["model"] == "m"
    assert body["max_tokens"] == STUDENT_MAX_NEW_TOKENS and body["temperature"] == 0


@pytest.mark.parametrize("prompt, message", [
    ("full", "is full (HTTP 429): The server's queue is full (4 requests waiting, at most 4); retry later. Send again"),
    ("bad", "refused the prompt (HTTP 400): The prompt is too long for the model's context."),
])
def test_a_refused_prompt_is_one_sentence_at_once(stub_url, prompt, message):
    sends = Sends()
    started = time.monotonic()
    sent = sends.send(stub_url, prompt, "you")
    assert sent.done and message in sent.error and time.monotonic() - started < 10
    assert sends.in_flight() == 0 and sends.own_request_ids() == set()


def test_an_unreachable_server_is_one_sentence_at_once():
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    sent = Sends().send(url, "hello", "you")
    assert sent.done and sent.error == f"Can't reach {url}: is `make serve` (python -m prefillviz serve) running there?"


def test_a_session_has_at_most_so_many_sends_running_and_each_ends(stub_url):
    sends = Sends(max_in_flight=1)
    first = sends.send(stub_url, "slow", "you")
    assert first.settled.is_set() and first.waiting  # taken by the server, and the page went on before its answer
    with pytest.raises(ProbeError, match="1 of your prompts are still being answered"):
        sends.send(stub_url, "another", "you")
    assert sends.wait_all(20) and first.text == "Hello"
    assert sends.send(stub_url, "another", "you").error is None and sends.wait_all(20)


@pytest.mark.parametrize("url, prompt, message", [
    ("127.0.0.1:8000", "hello", "is not a server URL"),
    ("http://127.0.0.1:8000", "   ", "Write a prompt first"),
    ("http://127.0.0.1:8000", "x" * 3000, "send at most 2,000"),
])
def test_what_cant_be_sent_is_refused_before_any_thread_starts(url, prompt, message):
    sends = Sends()
    with pytest.raises(ProbeError, match=message):
        sends.send(url, prompt, "you")
    assert sends.recent() == []
