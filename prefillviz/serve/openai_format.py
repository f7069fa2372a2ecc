"""The JSON bodies an OpenAI-compatible server answers with (OpenAI's API reference; vLLM's serving_*.py).

    non-stream  {"id", "object": "text_completion" | "chat.completion", "created", "model", "choices", "usage"}
    stream      data: {... "object": "text_completion" | "chat.completion.chunk", "choices": [delta]}\\n\\n
                ... a last chunk with "usage" and no choices (stream_options.include_usage), then data: [DONE]
    error       {"error": {"message", "type", "param", "code"}}  (with the HTTP status)
"""

from __future__ import annotations

import json
import time

from prefillviz.serve.protocol import CHAT

DONE = "data: [DONE]\n\n"
ERROR_TYPES = {400: "invalid_request_error", 429: "rate_limit_exceeded", 503: "service_unavailable",
               504: "timeout", 500: "internal_error"}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "error"), "param": param,
                      "code": code or status}}


def usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int) -> dict:
    """OpenAI's usage object, with the prefix-cache hit where vLLM puts it (``prompt_tokens_details``)."""
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
        "prompt_tokens_details": {"cached_tokens": num_cached_tokens},
    }


def _choice(kind: str, text: str, finish_reason: str | None, stream: bool) -> dict:
    if kind != CHAT:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    key = "delta" if stream else "message"
    return {"index": 0, key: {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish_reason}


class ResponseBuilder:
    """Every body of one response: the same id, creation time and model in each."""

    def __init__(self, kind: str, request_id: str, model: str) -> None:
        self.kind, self.request_id, self.model = kind, request_id, model
        self.created = int(time.time())

    def _head(self, stream: bool) -> dict:
        if self.kind == CHAT:
            obj = "chat.completion.chunk" if stream else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, finish_reason: str, usage_body: dict, token_ids: tuple[list[int], list[int]] | None
             = None) -> dict:
        """The whole answer at once (``stream`` false); ``token_ids``: (prompt's, answer's), as vLLM's
        ``return_token_ids`` adds them."""
        choice = _choice(self.kind, text, finish_reason, False)
        body = {**self._head(False), "choices": [choice], "usage": usage_body}
        if token_ids is not None:
            body["prompt_token_ids"], choice["token_ids"] = token_ids
        return body

    def chunk(self, text: str, finish_reason: str | None = None, token_ids: list[int] | None = None) -> str:
        """One server-sent event carrying new text (and, on the last, the finish reason)."""
        choice = _choice(self.kind, text, finish_reason, True)
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return f"data: {json.dumps({**self._head(True), 'choices': [choice]})}\n\n"

    def usage_chunk(self, usage_body: dict) -> str:
        """The last event before [DONE] when the client asked for ``stream_options.include_usage``."""
        return f"data: {json.dumps({**self._head(True), 'choices': [], 'usage': usage_body})}\n\n"

    @staticmethod
    def error_chunk(status: int, message: str) -> str:
        """An error after the stream began (the status line is already sent): one event, then [DONE]."""
        return f"data: {json.dumps(error_body(status, message))}\n\n"
