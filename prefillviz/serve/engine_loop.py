"""Continuous batching: one thread steps the engine; new requests join the scheduler between steps.

    HTTP handlers (event loop)                engine thread
    submit(stream) ----> inbox ---------->  add_request        } between steps
    abort(id)      ----> inbox ---------->  abort_request      }
                                            step()  -> each sampled token -> stream.put(Tokens)
    stream.events() <--- call_soon_threadsafe <-- finished -> stream.put(Finished), metrics, live record

The engine is only ever touched by its thread. A handler waits for a full queue (``max_waiting``
requests not yet running) with a 429, never with a hang; an idle loop sleeps on a condition with a
timeout. A failed step has already aborted its requests and freed their blocks (``LLMEngine.step``):
their clients get the error and the loop goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from prefillviz.engine.engine import LLMEngine
from prefillviz.engine.errors import RequestError
from prefillviz.engine.request import Request
from prefillviz.engine.request_checks import check_request
from prefillviz.serve.live import LiveRecorder
from prefillviz.serve.metrics import FINISH_REASONS, ServeMetrics
from prefillviz.serve.protocol import BadRequest, Generation
from prefillviz.serve.request_stream import Failed, Finished, RequestStream, Tokens

IDLE_WAIT_S = 0.5  # an idle loop wakes at least this often (to notice a stop)
MAX_KEPT_STEPS = 2048  # the engine's own step list is cut back to this under endless load
log = logging.getLogger("prefillviz.serve")


class QueueFull(Exception):
    """The waiting queue is full: the server answers 429."""


class NotRunning(Exception):
    """The loop has stopped (shutting down, or a bug stopped it): the server answers 503."""


class EngineLoop:
    """Owns the engine and the thread that steps it.

    Args:
        engine: the engine to serve (only this loop's thread touches it once ``start`` is called).
        metrics: where each step's and each finished request's figures go.
        max_waiting: most requests accepted but not yet running; one more is refused (``QueueFull``).
        recorder: the live record of steps for ``/prefillviz/steps`` (None: not recorded).
    """

    def __init__(self, engine: LLMEngine, metrics: ServeMetrics, max_waiting: int,
                 recorder: LiveRecorder | None = None) -> None:
        self.engine, self.metrics, self.max_waiting, self.recorder = engine, metrics, max_waiting, recorder
        self._inbox: deque[tuple[str, object]] = deque()  # ("add", RequestStream) or ("abort", request id)
        self._num_pending_adds = 0
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._streams: dict[str, tuple[RequestStream, Request]] = {}  # unfinished requests, engine thread only
        self._thread = threading.Thread(target=self._run, name="prefillviz-engine", daemon=True)
        self.failure: str | None = None  # why the loop died, if it did

    # ------------------------------------------------------------ from the HTTP side (any thread)
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop stepping, fail what is unfinished (503), and wait for the thread (at most ``timeout_s``)."""
        self._stop.set()
        with self._wake:
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def check(self, generation: Generation) -> None:
        """The engine's own checks (context, KV capacity, token ids), before the request is queued."""
        engine = self.engine
        try:
            check_request("check", generation.prompt_token_ids, generation.params, engine.config, engine.vocab_size,
                          engine.max_context, engine.num_blocks, ())
        except RequestError as error:
            raise BadRequest(str(error), "max_tokens" if "new token" in str(error) else "prompt") from error

    def submit(self, stream: RequestStream) -> None:
        """Queue a checked request for the next step; ``QueueFull`` when ``max_waiting`` are already waiting,
        ``NotRunning`` once the loop has stopped (checked under the lock its last drain takes)."""
        with self._wake:
            if self._stop.is_set():
                raise NotRunning(f"The engine loop is not running: {self.failure or 'the server is stopping'}.")
            num_waiting = self._num_pending_adds + len(self.engine.scheduler.waiting)
            if num_waiting >= self.max_waiting:
                raise QueueFull(f"The server's queue is full ({num_waiting} requests waiting, at most "
                                f"{self.max_waiting}); retry later.")
            self._num_pending_adds += 1
            self._inbox.append(("add", stream))
            self._wake.notify()

    def abort(self, request_id: str) -> None:
        """Stop a request (its client left): its blocks are freed before the next step."""
        with self._wake:
            self._inbox.append(("abort", request_id))
            self._wake.notify()

    # ------------------------------------------------------------ the engine thread
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._drain_inbox()
                if not self.engine.has_unfinished_requests():
                    self._trim_engine_history(idle=True)
                    with self._wake:
                        self._wake.wait_for(lambda: self._inbox or self._stop.is_set(), timeout=IDLE_WAIT_S)
                    continue
                self._step()
        except Exception as error:  # a bug: say so on /health and to every waiting client
            log.exception("the engine loop stopped")
            self.failure = f"{type(error).__name__}: {error}"
        finally:
            self._stop.set()  # no submit gets in after the last drain below
            self._fail_all(503, self.failure or "The server is shutting down.")

    def _drain_inbox(self) -> None:
        with self._wake:
            items, self._num_pending_adds = list(self._inbox), 0
            self._inbox.clear()
        for kind, item in items:
            if kind == "add":
                self._add(item)
            elif item in self._streams:
                self.engine.abort_request(item)
                self._finish(self._streams[item][1])

    def _add(self, stream: RequestStream) -> None:
        params = stream.generation.params
        try:
            request = self.engine.add_request(stream.generation.prompt_token_ids, params, stream.request_id)
        except RequestError as error:
            stream.put(Failed(400, str(error)))
            return
        self._streams[stream.request_id] = (stream, request)
        if self.recorder is not None:
            self.recorder.received(stream.request_id, stream.generation.user)

    def _step(self) -> None:
        try:
            record = self.engine.step()
        except Exception as error:  # the engine aborted the step's requests and freed their blocks
            log.warning("a step failed: %s", error)
            for stream, request in list(self._streams.values()):
                if request.is_finished:
                    stream.put(Failed(500, f"The engine step failed: {error}"))
                    self._finish(request, tell_client=False)
            return
        for request_id, token_id in record.sampled_token_ids.items():
            stream, request = self._streams[request_id]
            stream.put(Tokens([token_id], self._finished_event(request) if request.is_finished else None))
        scheduler = self.engine.scheduler
        self.metrics.after_step(
            len(scheduler.running), len(scheduler.waiting), 1 - record.num_free_blocks / self.engine.num_blocks,
            scheduler.prefix_cache_queries, scheduler.prefix_cache_hits, len(record.preempted_request_ids),
            len(record.sampled_token_ids),
        )
        if self.recorder is not None:
            self.recorder.record_step(record, self.engine, [request for _, request in self._streams.values()])
        for chunk in record.chunks:
            request = self._streams[chunk.request_id][1]
            if request.is_finished:
                self._finish(request, tell_client=chunk.request_id not in record.sampled_token_ids)
        self._trim_engine_history(idle=False)

    @staticmethod
    def _finished_event(request: Request) -> Finished:
        return Finished(FINISH_REASONS.get(request.status, "abort"), request.num_prompt_tokens,
                        len(request.output_token_ids), request.num_cached_tokens)

    def _finish(self, request: Request, tell_client: bool = True) -> None:
        """Let a finished request go: tell its client (unless its last tokens did), count it, forget it."""
        stream, _ = self._streams.pop(request.request_id)
        if tell_client:
            stream.put(self._finished_event(request))
        self.metrics.finished(request, stream.received_time)
        if self.recorder is not None:
            self.recorder.finished(request, stream.received_time)
        self.engine.request_records.pop(request.request_id, None)  # a server's history would grow without end

    def _trim_engine_history(self, idle: bool) -> None:
        """The engine keeps every step for its trace; a server keeps only the recent ones (the live record)."""
        steps = self.engine.steps
        if idle and steps:
            steps.clear()
        elif len(steps) > 2 * MAX_KEPT_STEPS:
            del steps[:-MAX_KEPT_STEPS]

    def _fail_all(self, status: int, message: str) -> None:
        with self._wake:
            pending = [item for kind, item in self._inbox if kind == "add"]
            self._inbox.clear()
        for stream in pending:
            stream.put(Failed(status, message))
        for stream, request in list(self._streams.values()):
            if not request.is_finished:
                self.engine.abort_request(request.request_id)
            stream.put(Failed(status, message))
            self._finish(request, tell_client=False)

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether the engine has no unfinished request within ``timeout_s`` (tests and shutdown)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._inbox and not self._streams:
                return True
            time.sleep(0.05)
        return False
