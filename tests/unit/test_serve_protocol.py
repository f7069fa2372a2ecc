"""The server's request parsing without a model: what vLLM's benchmark client sends is accepted as it
means it, what the engine can't do is a 400 naming the field, and stream chunks carry OpenAI's shape."""

import json

import pytest

from prefillviz.serve.openai_format import DONE, ResponseBuilder, usage
from prefillviz.serve.protocol import CHAT, COMPLETION, BadRequest, parse_generation

MODEL, EOS = "m", 2
VLLM_BENCH_BODY = {  # vllm/benchmarks/lib/endpoint_request_func.py, async_request_openai_completions, --ignore-eos
    "model": MODEL, "prompt": [5, 6, 7], "repetition_penalty": 1.0, "max_tokens": 32, "logprobs": None,
    "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
}


def parse(body: dict, kind: str = COMPLETION):
    return parse_generation(body, kind, [MODEL], tokenizer=None, max_context=64, eos_token_id=EOS)


def test_the_vllm_bench_body_is_a_streamed_sampled_request_that_ignores_eos():
    generation = parse(VLLM_BENCH_BODY)
    assert generation.prompt_token_ids == [5, 6, 7] and generation.stream and generation.include_usage
    params = generation.params
    assert params.max_new_tokens == 32 and params.temperature == 1.0 and params.stop_token_ids == ()


def test_defaults_are_openais_and_eos_stops_unless_ignored():
    generation = parse({"prompt": [1, 2]})
    assert generation.model == MODEL and generation.params.max_new_tokens == 16 and not generation.stream
    assert generation.params.stop_token_ids == (EOS,)
    assert parse({"prompt": [1], "top_k": -1}).params.top_k == 0  # vLLM's "no cut" is ours


@pytest.mark.parametrize("body, param", [
    ({"prompt": [1], "model": "other"}, "model"),
    ({"prompt": [1], "repetition_penalty": 1.2}, "repetition_penalty"),
    ({"prompt": [1], "logprobs": 5}, "logprobs"),
    ({"prompt": [1], "stop": ["\n"]}, "stop"),
    ({"prompt": [1], "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": [1], "temperature": "hot"}, "temperature"),
    ({"prompt": [1], "max_tokens": 1.5}, "max_tokens"),
    ({"prompt": [1], "seed": True}, "seed"),
    ({"prompt": [[1], [2]]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1], "n": 3}, "n"),
])
def test_what_the_engine_cannot_do_is_a_400_naming_the_field(body, param):
    with pytest.raises(BadRequest) as refused:
        parse(body)
    assert refused.value.param == param and refused.value.message


def test_chat_needs_messages_with_text():
    for messages in (None, [], [{"role": "user"}], [{"role": "user", "content": [{"type": "image_url"}]}]):
        with pytest.raises(BadRequest, match="messages"):
            parse({"messages": messages}, CHAT)


def test_a_stream_is_openais_chunks_then_usage_then_done():
    builder = ResponseBuilder(CHAT, "chatcmpl-1", MODEL)
    first = json.loads(builder.chunk("Hel").removeprefix("data: "))
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"]["content"] == "Hel"
    last = json.loads(builder.chunk("lo", "stop", [9]).removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["token_ids"] == [9]
    tail = json.loads(builder.usage_chunk(usage(3, 2, 0)).removeprefix("data: "))
    assert tail["choices"] == [] and tail["usage"]["total_tokens"] == 5 and DONE == "data: [DONE]\n\n"
