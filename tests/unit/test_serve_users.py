"""OpenAI's ``user`` field on our server, without a model: the protocol keeps it (a 400 names it when it is not a
short string), the live recorder keeps it with each request's steps and its TTFT split and lets it go with the
request, and ``/prefillviz/steps`` returns it, so the Live engine page can name every student's request."""

import types

import pytest
from starlette.testclient import TestClient

from prefillviz.engine.request import RequestStatus
from prefillviz.serve.app import ServedModel, build_app
from prefillviz.serve.engine_loop import QueueFull
from prefillviz.serve.live import LiveRecorder
from prefillviz.serve.protocol import CHAT, COMPLETION, MAX_USER_CHARS, BadRequest, parse_generation

MODEL = "m"


def parse(body: dict, kind: str = COMPLETION):
    return parse_generation(body, kind, [MODEL], tokenizer=None, max_context=64, eos_token_id=2)


def test_the_user_field_is_kept_and_checked():
    assert parse({"prompt": [1]}).user is None
    assert parse({"prompt": [1], "user": "student 7"}).user == "student 7"
    assert parse({"prompt": [1], "user": "  "}).user is None
    for bad in (7, ["student"], "x" * (MAX_USER_CHARS + 1)):
        with pytest.raises(BadRequest) as refused:
            parse({"prompt": [1], "user": bad})
        assert refused.value.param == "user"


def chunk(request_id: str, num_tokens: int, is_prefill: bool):
    return types.SimpleNamespace(request_id=request_id, num_tokens=num_tokens, is_prefill=is_prefill)


def step_record(chunks, sampled):
    return types.SimpleNamespace(start_time_s=0.0, wall_time_s=0.01, forward_time_s=0.008, update_time_s=0.0,
                                 chunks=chunks, sampled_token_ids=sampled, num_free_blocks=90, blocks_hit={},
                                 preempted_request_ids=[])


def finished_request(request_id: str, first_token_time: float):
    return types.SimpleNamespace(request_id=request_id, status=RequestStatus.FINISHED_LENGTH, num_prompt_tokens=30,
                                 num_cached_tokens=16, output_token_ids=[5], first_scheduled_time=first_token_time,
                                 first_token_time=first_token_time)


def recorded() -> LiveRecorder:
    """Two requests in one step: one tagged by a student's Send, one from a client that sends no user."""
    recorder = LiveRecorder(token_budget=2048, num_blocks=100)
    recorder.received("chatcmpl-a", "student 7")
    recorder.received("chatcmpl-b", None)
    engine = types.SimpleNamespace(start_time=recorder.t0)
    recorder.record_step(step_record([chunk("chatcmpl-a", 30, True), chunk("chatcmpl-b", 30, True)],
                                     {"chatcmpl-a": 5, "chatcmpl-b": 6}), engine, [])
    for request_id in ("chatcmpl-a", "chatcmpl-b"):
        recorder.finished(finished_request(request_id, recorder.t0 + 0.01), recorder.t0)
    return recorder


def test_the_live_record_names_each_request_by_its_user_in_its_steps_and_its_ttft_split():
    recorder = recorded()
    snapshot = recorder.snapshot()
    assert snapshot["steps"][0]["users"] == {"chatcmpl-a": "student 7"}  # the untagged one has no entry
    assert [(r["request_id"], r["user"]) for r in snapshot["requests"]] == [("chatcmpl-a", "student 7"),
                                                                             ("chatcmpl-b", None)]
    assert recorder._users == {}  # let go with the request: a long-running server keeps no tag forever


class StubLoop:
    """What the routes need of an ``EngineLoop``; its queue is always full, so a request comes back at once."""

    alive, failure = True, None

    def __init__(self) -> None:
        self.submitted = []

    def check(self, generation) -> None:
        pass

    def submit(self, stream) -> None:
        self.submitted.append(stream)
        raise QueueFull("full")


def test_the_server_hands_the_user_to_the_engine_and_returns_it_from_its_live_record():
    loop, tokenizer = StubLoop(), types.SimpleNamespace(chat_template="t", apply_chat_template=lambda *a, **k: [1, 2])
    app = build_app(loop, ServedModel([MODEL], tokenizer, 64, 2), recorded())
    with TestClient(app) as client:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "user": "student 3"}
        assert client.post("/v1/chat/completions", json=body).status_code == 429
        live = client.get("/prefillviz/steps").json()
    assert loop.submitted[0].generation.user == "student 3" and loop.submitted[0].generation.kind == CHAT
    assert live["steps"][0]["users"] == {"chatcmpl-a": "student 7"} and live["requests"][0]["user"] == "student 7"
