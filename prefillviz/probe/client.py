"""An OpenAI-compatible server seen from outside: what it serves, streamed completions, /metrics.

``ServerClient`` wraps one ``httpx.Client``. Every call has a timeout (connect, each read,
and a deadline for a whole streamed answer), and every failure becomes a ``ProbeError``
that says what went wrong in words: the URL can't be reached, it is not an OpenAI-compatible
server, it does not serve that model, it stalled, or it answered junk. ``ProbeBudget``
bounds what one probe may send, counted before each request goes out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx

from prefillviz.engine.errors import ProbeError
from prefillviz.loading.hosted import normalized_url

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0  # the longest silence allowed between two bytes of an answer
REQUEST_DEADLINE_S = 180.0  # the longest one streamed answer may take in all


@dataclass
class ProbeBudget:
    """Upper bounds on what one probe sends: requests, prompt tokens and new tokens."""

    max_requests: int = 200
    max_prompt_tokens: int = 250_000
    max_new_tokens: int = 4_000
    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_new_tokens: int = 0

    def spend(self, prompt_tokens: int, new_tokens: int) -> None:
        """Count one request before it is sent; raises ``ProbeError`` when it would go over."""
        over = [
            f"{what} ({used + add:,} > {limit:,})"
            for what, used, add, limit in (
                ("requests", self.num_requests, 1, self.max_requests),
                ("prompt tokens", self.num_prompt_tokens, prompt_tokens, self.max_prompt_tokens),
                ("new tokens", self.num_new_tokens, new_tokens, self.max_new_tokens),
            )
            if used + add > limit
        ]
        if over:
            raise ProbeError(
                f"The probe stopped before going over its bounds: {', '.join(over)}. Pick fewer sizes or runs."
            )
        self.num_requests += 1
        self.num_prompt_tokens += prompt_tokens
        self.num_new_tokens += new_tokens


@dataclass
class StreamedCompletion:
    """One streamed completion as the client saw it (times from ``time.perf_counter``)."""

    sent_s: float
    token_times_s: list[float] = field(default_factory=list)  # one per streamed chunk that carried text
    text: str = ""
    prompt_tokens: int | None = None  # the server's usage.prompt_tokens, when it reports usage
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when reported
    completion_tokens: int | None = None  # usage.completion_tokens, when reported
    finish_reason: str | None = None
    stopped_early: bool = False  # the client closed the stream (``stop_when`` said so)

    @property
    def time_to_first_token_s(self) -> float | None:
        return self.token_times_s[0] - self.sent_s if self.token_times_s else None


class ServerClient:
    """One OpenAI-compatible server: ``models``, ``server_info``, ``stream_completion``, ``metrics_text``.

    Use it as a context manager (it holds a connection pool). ``budget`` bounds every request
    it sends; ``api_key`` goes out as a bearer token when given.
    """

    def __init__(
        self, url: str, api_key: str | None = None, budget: ProbeBudget | None = None,
        read_timeout_s: float = READ_TIMEOUT_S, request_deadline_s: float = REQUEST_DEADLINE_S,
    ) -> None:
        self.url = normalized_url(url)
        self.budget = budget or ProbeBudget()
        self.request_deadline_s = request_deadline_s
        self.read_timeout_s = read_timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(read_timeout_s, connect=CONNECT_TIMEOUT_S)
        self.http = httpx.Client(
            base_url=self.url, timeout=timeout, headers=headers, follow_redirects=False, trust_env=False
        )
        self.extra_body: dict = {"ignore_eos": True}  # vLLM, SGLang, llama.cpp: a fixed number of new tokens
        self.server_header: str | None = None

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn the HTTP client's failures into a ``ProbeError`` that names the URL and the call."""
        try:
            yield
        except httpx.ConnectTimeout as error:
            raise ProbeError(
                f"{self.url} did not accept a connection within {CONNECT_TIMEOUT_S:.0f} s ({what})."
            ) from error
        except httpx.ConnectError as error:
            raise ProbeError(
                f"Could not reach {self.url} ({what}): {error}. Is the server running, and is the URL right?"
            ) from error
        except httpx.TimeoutException as error:
            raise ProbeError(
                f"{self.url} stalled: no answer within {self.read_timeout_s:.0f} s ({what}). The probe stopped waiting."
            ) from error
        except httpx.HTTPError as error:
            raise ProbeError(f"{self.url} broke off {what}: {type(error).__name__}: {error}") from error

    def _json(self, response: httpx.Response, what: str):
        if response.status_code >= 400:
            raise ProbeError(f"{self.url} answered {what} with HTTP {response.status_code}: {response.text[:300]!r}")
        try:
            return response.json()
        except ValueError as error:
            raise ProbeError(
                f"{self.url} answered {what} with something that is not JSON ({response.text[:120]!r}): "
                "is this an OpenAI-compatible server?"
            ) from error

    def models(self) -> list[dict]:
        """``GET /v1/models``: the models it serves (each a dict with at least ``id``)."""
        with self._errors("GET /v1/models"):
            response = self.http.get("/v1/models")
        self.server_header = response.headers.get("server")
        if response.status_code == 404:
            raise ProbeError(
                f"{self.url} has no /v1/models (HTTP 404): it is not an OpenAI-compatible server, "
                "or the URL's path is wrong."
            )
        listing = self._json(response, "GET /v1/models")
        data = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            raise ProbeError(f"{self.url}'s /v1/models is not an OpenAI model list ({str(listing)[:200]!r}).")
        return data

    def choose_model(self, models: list[dict], model: str | None) -> dict:
        """The listed model named ``model`` (the first one listed when None); a clear error otherwise."""
        if not models:
            raise ProbeError(f"{self.url} serves no model (its /v1/models is empty).")
        if not model:
            return models[0]
        for listed in models:
            if listed["id"] == model:
                return listed
        raise ProbeError(f"{self.url} does not serve {model!r}; it serves: {', '.join(m['id'] for m in models)}.")

    def get_optional(self, path: str) -> httpx.Response | None:
        """``GET path``, or None when the server has no such page or can't be asked."""
        try:
            response = self.http.get(path)
        except httpx.HTTPError:
            return None
        return response if response.status_code == 200 else None

    def count_prompt_tokens(self, model: str, prompt: str) -> int:
        """The server's count of ``prompt``'s tokens (``usage.prompt_tokens`` of a one-token completion)."""
        self.budget.spend(len(prompt) // 3, 1)  # a generous guess: no tokenizer here knows the server's
        body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
        with self._errors("POST /v1/completions"):
            response = self.http.post("/v1/completions", json=body)
        answer = self._json(response, "POST /v1/completions")
        usage = answer.get("usage") if isinstance(answer, dict) else None
        if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
            raise ProbeError(
                f"{self.url}'s completion has no usage.prompt_tokens ({str(answer)[:200]!r}): "
                "the probe can't size prompts."
            )
        return usage["prompt_tokens"]

    def stream_completion(
        self, model: str, prompt: str, max_tokens: int, estimated_prompt_tokens: int,
        stop_when: Callable[[StreamedCompletion], bool] | None = None, _counted: bool = False,
    ) -> StreamedCompletion:
        """One streamed ``/v1/completions`` (greedy), timed chunk by chunk on this machine's clock.

        ``stop_when`` is asked after each chunk; when it says so the stream is closed, which
        a server takes as the client going away (vLLM aborts the request).
        """
        if not _counted:
            self.budget.spend(estimated_prompt_tokens, max_tokens)
        body = {
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, **self.extra_body,
        }
        deadline = time.monotonic() + self.request_deadline_s
        with self._errors("a streamed POST /v1/completions"):
            result = StreamedCompletion(sent_s=time.perf_counter())
            with self.http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code in (400, 422) and self.extra_body:
                    response.read()
                    self.extra_body = {}  # a server that refuses vLLM's extras: plain OpenAI from now on
                    return self.stream_completion(
                        model, prompt, max_tokens, estimated_prompt_tokens, stop_when, _counted=True
                    )
                if response.status_code >= 400:
                    response.read()
                    self._json(response, "a streamed POST /v1/completions")  # raises with its status and text
                for line in response.iter_lines():
                    if time.monotonic() > deadline:
                        raise ProbeError(
                            f"{self.url} took over {self.request_deadline_s:.0f} s for one answer; "
                            "the probe stopped it."
                        )
                    if self.take_line(line, result) == "done":
                        break
                    if stop_when is not None and stop_when(result):
                        result.stopped_early = True
                        break
        return result

    def take_line(self, line: str, result: StreamedCompletion) -> str | None:
        """Read one server-sent-events line into ``result``; "done" at ``data: [DONE]``."""
        line = line.strip()
        if not line or line.startswith(":") or line.startswith(("event:", "id:", "retry:")):
            return None
        if not line.startswith("data:"):
            raise ProbeError(f"{self.url} streamed something that is not server-sent events ({line[:120]!r}).")
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            return "done"
        now = time.perf_counter()
        try:
            chunk = json.loads(payload)
        except ValueError as error:
            raise ProbeError(f"{self.url} streamed junk, not JSON ({payload[:120]!r}).") from error
        if not isinstance(chunk, dict):
            raise ProbeError(f"{self.url} streamed a chunk that is not a completion ({payload[:120]!r}).")
        if "error" in chunk:
            raise ProbeError(f"{self.url} reported an error mid-stream: {str(chunk['error'])[:300]}")
        for choice in chunk.get("choices") or []:
            text = choice.get("text") if isinstance(choice, dict) else None
            if text is None:
                raise ProbeError(
                    f"{self.url} streamed a choice with no text ({payload[:120]!r}): not a /v1/completions stream."
                )
            result.token_times_s.append(now)
            result.text += text
            result.finish_reason = choice.get("finish_reason") or result.finish_reason
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            result.prompt_tokens = usage.get("prompt_tokens", result.prompt_tokens)
            result.completion_tokens = usage.get("completion_tokens", result.completion_tokens)
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                result.cached_tokens = details["cached_tokens"]
        return None

    def metrics_text(self) -> str | None:
        """The server's Prometheus text at ``/metrics`` (None when it has none)."""
        response = self.get_optional("/metrics")
        if response is None or "text/html" in response.headers.get("content-type", ""):
            return None
        return response.text
