"""One request's way back: the engine thread puts events, the request's HTTP handler awaits them.

    engine thread --put(Tokens | Finished | Failed)--> loop.call_soon_threadsafe --> asyncio.Queue --> handler

``events`` never waits forever: it gives up after the request's deadline (a 504) and, between events,
asks whether the client is still there, so a caller that went away is noticed even without a stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from prefillviz.serve.protocol import Generation

POLL_S = 1.0  # how often a waiting handler checks its client and its deadline


@dataclass
class Finished:
    finish_reason: str  # "stop", "length" or "abort" (OpenAI's and vLLM's words)
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int  # prompt tokens the prefix cache served


@dataclass
class Tokens:
    token_ids: list[int]  # sampled in one engine step (one per step for a request)
    finish: Finished | None = None  # set on the request's last tokens: they go out with the finish reason


@dataclass
class Failed:
    status: int  # the HTTP status it would have had before the stream began
    message: str


Event = Tokens | Finished | Failed


class RequestStream:
    """Carries one request's events across threads; made in the handler, fed by ``EngineLoop``."""

    def __init__(self, request_id: str, generation: Generation, loop: asyncio.AbstractEventLoop,
                 received_time: float) -> None:
        self.request_id = request_id
        self.generation = generation
        self.received_time = received_time  # perf_counter at arrival: vLLM's TTFT and queue time count from here
        self._loop = loop
        self._queue: asyncio.Queue[Event] = asyncio.Queue()

    def put(self, event: Event) -> None:
        """Hand an event to the handler (any thread); dropped once the server's event loop has closed."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening
            pass

    async def events(self, timeout_s: float, is_disconnected: Callable[[], Awaitable[bool]] | None = None,
                     ) -> AsyncIterator[Event]:
        """Every event until ``Finished`` or ``Failed``; a ``Failed`` 504 past the deadline; stops early
        (yielding nothing more) when ``is_disconnected`` says the client left."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                yield Failed(504, f"The request took longer than the server's limit of {timeout_s:.0f} s.")
                return
            try:
                event = await asyncio.wait_for(self._queue.get(), timeout=min(POLL_S, left))
            except TimeoutError:
                if is_disconnected is not None and await is_disconnected():
                    return
                continue
            yield event
            if isinstance(event, Finished | Failed) or (isinstance(event, Tokens) and event.finish is not None):
                return


class IncrementalText:
    """Token ids -> the text they add, never cutting a character in half, in time independent of the answer's
    length (TGI's and vLLM's incremental detokenizing). Only a window is decoded: the tokens since
    ``prefix_offset`` (a little context, so a token's leading space comes out right), of which those before
    ``read_offset`` were already sent. A byte-level BPE token can end inside a UTF-8 sequence: its text is
    held back (a trailing U+FFFD) until a later token completes it.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self.text = ""
        self.prefix_offset = self.read_offset = 0

    def _window(self, end: int | None = None) -> str:
        return self.tokenizer.decode(self.token_ids[self.prefix_offset:end], skip_special_tokens=True)

    def add(self, token_ids: list[int]) -> str:
        self.token_ids.extend(token_ids)
        sent, window = self._window(self.read_offset), self._window()
        if len(window) <= len(sent) or window.endswith("\ufffd"):
            return ""
        new = window[len(sent):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        self.text += new
        return new

    def flush(self) -> str:
        """Whatever was held back, once no more tokens will come."""
        sent, window = self._window(self.read_offset), self._window()
        new = window[len(sent):] if len(window) > len(sent) else ""
        self.prefix_offset = self.read_offset = len(self.token_ids)
        self.text += new
        return new
