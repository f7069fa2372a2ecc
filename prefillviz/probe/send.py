"""Send one prompt to a served engine from a page, through the OpenAI SDK, without holding the page for the answer.

    page (script thread)                     one thread a prompt
    Sends.send(url, prompt, user) --start--> models.list(), chat.completions.create(stream=True, user=user)
      waits at most ACCEPT_WAIT_S  <-------- accepted (the stream began) | failed (unreachable, a 4xx, a 429)
    later reruns read Sent.text    <-------- each streamed piece; done at the end, at the deadline, or on an error

``user`` is OpenAI's standard field: the server keeps it with the request, and its live record names the request
by it (a class room's "student 7"). The client reads with a timeout and never retries (a refused prompt is the
user's to send again); every send ends by ``DEADLINE_S`` whatever the server does, and a session has at most
``MAX_IN_FLIGHT`` sends running, so nothing outlives a closed page for long.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import openai

from prefillviz.engine.errors import ProbeError
from prefillviz.experiments.class_burst import STUDENT_MAX_NEW_TOKENS
from prefillviz.loading.hosted import normalized_url

MAX_IN_FLIGHT = 3  # sends of one session running at once
KEEP_SENT = 8  # the most recent sends a session lists
MAX_PROMPT_CHARS = 2000
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0  # a prompt queued behind a class's answers gets no byte until its first token
DEADLINE_S = 180.0  # the most one send runs, answer included
ACCEPT_WAIT_S = 10.0  # the page waits this long to say "sent" or why not


@dataclass
class Sent:
    """One prompt sent from a session, filled in by its thread as the answer streams in."""

    url: str
    prompt: str
    user: str
    started_s: float = field(default_factory=time.monotonic)
    request_id: str | None = None  # the server's id (``cmpl-...``), known from the first streamed piece
    text: str = ""
    first_token_s: float | None = None  # time to the first streamed piece, on this client's clock
    error: str | None = None
    done: bool = False
    settled: threading.Event = field(default_factory=threading.Event)  # accepted, refused or failed

    @property
    def waiting(self) -> bool:
        return not self.done and self.request_id is None


def _refusal(base: str, error: openai.APIStatusError) -> str:
    body = error.body if isinstance(error.body, dict) else {}
    message = body.get("message") or error.message
    if error.status_code == 429:
        return f"{base} is full (HTTP 429): {message} Send again in a moment."
    return f"{base} refused the prompt (HTTP {error.status_code}): {message}"


def failure_message(base: str, error: Exception) -> str:
    """One sentence for whatever stopped a send."""
    if isinstance(error, openai.APITimeoutError):
        return f"{base} did not answer within {READ_TIMEOUT_S:.0f} s."
    if isinstance(error, openai.APIConnectionError):
        return f"Can't reach {base}: is `make serve` (python -m prefillviz serve) running there?"
    if isinstance(error, openai.APIStatusError):
        return _refusal(base, error)
    if isinstance(error, openai.APIError):
        return f"{base} stopped the answer: {error.message}"
    return f"The send to {base} failed: {type(error).__name__}: {error}"


def _stream(sent: Sent, base: str) -> None:
    """The send thread: ask, stream the answer into ``sent``, and always end (``done``, ``settled``)."""
    client = None
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0,
                               timeout=openai.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        model = client.models.list().data[0].id
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": sent.prompt}], max_tokens=STUDENT_MAX_NEW_TOKENS,
            temperature=0, stream=True, user=sent.user,
        )
        sent.settled.set()
        with stream:
            for chunk in stream:
                if sent.request_id is None:
                    sent.request_id, sent.first_token_s = chunk.id, time.monotonic() - sent.started_s
                if chunk.choices and chunk.choices[0].delta.content:
                    sent.text += chunk.choices[0].delta.content
                if time.monotonic() - sent.started_s > DEADLINE_S:
                    sent.error = f"Stopped after {DEADLINE_S:.0f} s: the answer was still coming."
                    break
    except Exception as error:  # every failure is one message on the page, never a dead thread's traceback
        sent.error = failure_message(base, error)
    finally:
        if client is not None:
            client.close()
        sent.done = True
        sent.settled.set()


class Sends:
    """One session's sends (kept in its ``st.session_state``)."""

    def __init__(self, max_in_flight: int = MAX_IN_FLIGHT, accept_wait_s: float = ACCEPT_WAIT_S) -> None:
        self.max_in_flight, self.accept_wait_s = max_in_flight, accept_wait_s
        self._lock = threading.Lock()
        self._sent: list[Sent] = []

    def in_flight(self) -> int:
        with self._lock:
            return sum(not sent.done for sent in self._sent)

    def recent(self) -> list[Sent]:
        """The latest sends, newest first."""
        with self._lock:
            return list(reversed(self._sent))

    def own_request_ids(self) -> set[str]:
        """The server's ids of this session's requests (for the figures to mark them)."""
        with self._lock:
            return {sent.request_id for sent in self._sent if sent.request_id}

    def send(self, url: str, prompt: str, user: str) -> Sent:
        """Start sending ``prompt`` to the server at ``url`` tagged ``user``; wait at most ``accept_wait_s`` for
        the server to take it or refuse it (``Sent.error``) and return; the answer streams in after.

        Raises:
            ProbeError: not a server URL, an empty or too long prompt, or ``max_in_flight`` sends still running.
        """
        base = normalized_url(url)
        if not prompt.strip():
            raise ProbeError("Write a prompt first.")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ProbeError(f"The prompt is {len(prompt):,} characters; send at most {MAX_PROMPT_CHARS:,}.")
        with self._lock:
            running = sum(not sent.done for sent in self._sent)
            if running >= self.max_in_flight:
                raise ProbeError(f"{running} of your prompts are still being answered; send again when one is done.")
            sent = Sent(base, prompt, user)
            kept = [*self._sent, sent]
            for old in [s for s in kept if s.done][:max(0, len(kept) - KEEP_SENT)]:  # the oldest answered ones
                kept.remove(old)
            self._sent = kept
        threading.Thread(target=_stream, args=(sent, base), name="prefillviz-send", daemon=True).start()
        sent.settled.wait(self.accept_wait_s)
        return sent

    def wait_all(self, timeout_s: float) -> bool:
        """Whether every send has ended within ``timeout_s`` (tests, and a page that must not leave one behind)."""
        deadline = time.monotonic() + timeout_s
        for sent in self.recent():
            while not sent.done and time.monotonic() < deadline:
                time.sleep(0.05)
        return self.in_flight() == 0
