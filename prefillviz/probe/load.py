"""One load point on a server: many streamed requests in flight at once, open or closed loop.

* open loop (``mode="rate"``): requests arrive as a Poisson process of ``load`` requests/s
  (exponential gaps from a seeded generator) and are sent whether or not earlier ones have
  finished, the way independent users arrive;
* closed loop (``mode="concurrency"``): ``load`` users, each sending its next request as soon
  as its last one has ended, the way a benchmark client with a fixed pool behaves.

Every request is a streamed ``/v1/completions`` on one ``httpx.AsyncClient``, timed chunk by
chunk on this machine's clock. While the point runs, ``/metrics`` is read every
``GAUGE_POLL_S`` for the gauges a before/after snapshot can't see (requests waiting, KV cache
in use). The point ends when every request has, or at the first of: more errors than
``max_errors``, ``should_stop()``, the deadline. Then every request still in flight is
cancelled (its stream closed, which vLLM takes as an abort) before the client closes.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from prefillviz.probe.client import CONNECT_TIMEOUT_S, ProbeError, ServerClient, StreamedCompletion
from prefillviz.probe.metrics import parse_metrics

GAUGE_POLL_S = 0.5
GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")


@dataclass
class PlannedRequest:
    prompt: str
    target_tokens: int
    shared_prefix: bool  # starts with the sweep's shared system prompt


@dataclass
class RequestRecord:
    """One request of a load point as the client saw it (seconds since the point started)."""

    sent_s: float
    target_tokens: int
    shared_prefix: bool
    prompt_tokens: int | None = None  # the server's count (usage), when it reports it
    time_to_first_token_s: float | None = None
    token_gaps_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    end_s: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.time_to_first_token_s is not None

    @property
    def inter_token_s_mean(self) -> float | None:
        return sum(self.token_gaps_s) / len(self.token_gaps_s) if self.token_gaps_s else None


@dataclass
class PointRun:
    """What ``run_point`` saw: the records, how long it ran, the gauges' peaks, and why it ended early."""

    records: list[RequestRecord]
    duration_s: float
    gauge_peaks: dict[str, float]
    ended_because: str | None = None  # None: every planned request finished


def arrival_times_s(rate: float, num_requests: int, seed: int) -> list[float]:
    """Poisson arrivals: ``num_requests`` times with exponential gaps of mean ``1 / rate``, the first at 0."""
    rng = random.Random(seed)
    times, now = [], 0.0
    for index in range(num_requests):
        times.append(now)
        now += rng.expovariate(rate) if index + 1 < num_requests else 0.0
    return times


async def _stream(
    http: httpx.AsyncClient, client: ServerClient, body: dict, record: RequestRecord, started: float
) -> None:
    """Send one streamed completion and fill ``record``; raises on any failure (the caller records it)."""
    answer = StreamedCompletion(sent_s=time.perf_counter())
    record.sent_s = answer.sent_s - started
    async with http.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code >= 400:
            text = (await response.aread()).decode(errors="replace")
            raise ProbeError(f"HTTP {response.status_code}: {text[:200]!r}")
        async for line in response.aiter_lines():
            if client.take_line(line, answer) == "done":
                break
    times = answer.token_times_s
    if not times:
        raise ProbeError(f"no token streamed (finish reason {answer.finish_reason!r})")
    record.time_to_first_token_s = times[0] - answer.sent_s
    record.token_gaps_s = [b - a for a, b in zip(times, times[1:])]
    record.output_tokens = answer.completion_tokens if answer.completion_tokens is not None else len(times)
    record.prompt_tokens = answer.prompt_tokens
    record.end_s = times[-1] - started


async def _poll_gauges(http: httpx.AsyncClient, peaks: dict[str, float]) -> None:
    while True:
        try:
            response = await http.get("/metrics", timeout=2.0)
            if response.status_code == 200:
                snapshot = parse_metrics(response.text)
                for name in GAUGES:
                    if name in snapshot:
                        peaks[name] = max(peaks.get(name, 0.0), snapshot[name])
        except (httpx.HTTPError, ProbeError):
            pass  # a missed reading: the peak is a lower bound
        await asyncio.sleep(GAUGE_POLL_S)


async def _run_point(
    client: ServerClient, model: str, mode: str, load: float, plan: list[PlannedRequest], max_tokens: int,
    max_errors: int, deadline_s: float, request_deadline_s: float, seed: int, poll_metrics: bool,
    should_stop: Callable[[], bool], on_done: Callable[[RequestRecord], None],
) -> PointRun:
    records: list[RequestRecord] = []
    peaks: dict[str, float] = {}
    tasks: set[asyncio.Task] = set()
    ended_because: list[str] = []
    # reported to ``on_done`` by the loop below, so a callback that raises (a page's stop) ends the point
    finished: list[RequestRecord] = []
    num_reported = 0
    timeout = httpx.Timeout(client.read_timeout_s, connect=CONNECT_TIMEOUT_S)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    started = time.perf_counter()

    async def one(request: PlannedRequest) -> None:
        client.budget.spend(request.target_tokens, max_tokens)
        record = RequestRecord(
            sent_s=time.perf_counter() - started, target_tokens=request.target_tokens,
            shared_prefix=request.shared_prefix,
        )
        records.append(record)
        body = {"model": model, "prompt": request.prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}, **client.extra_body}
        try:
            await asyncio.wait_for(_stream(http, client, body, record, started), request_deadline_s)
        except TimeoutError:
            record.error = f"no whole answer within {request_deadline_s:.0f} s"
        except httpx.TimeoutException:
            record.error = f"stalled: no byte within {client.read_timeout_s:.0f} s"
        except (httpx.HTTPError, ProbeError) as error:
            record.error = f"{type(error).__name__}: {error}" if isinstance(error, httpx.HTTPError) else str(error)
        if record.end_s is None:
            record.end_s = time.perf_counter() - started
        finished.append(record)

    def why_end() -> str | None:
        errors = [r for r in records if r.error]
        if len(errors) > max_errors:
            return f"{len(errors)} of {len(records)} requests failed (first: {errors[0].error})"
        if should_stop():
            return "stopped by the user"
        if time.perf_counter() - started > deadline_s:
            return f"the time bound ran out ({deadline_s:.0f} s left for this point)"
        return None

    def report_done() -> None:
        nonlocal num_reported
        for record in finished[num_reported:]:
            on_done(record)
        num_reported = len(finished)

    async def closed_loop_user(queue: list[PlannedRequest]) -> None:
        while queue and not ended_because:
            await one(queue.pop(0))

    async with httpx.AsyncClient(
        base_url=client.url, timeout=timeout, limits=limits, headers=client.http.headers, trust_env=False
    ) as http:
        poller = asyncio.create_task(_poll_gauges(http, peaks)) if poll_metrics else None
        try:
            if mode == "rate":
                for arrival, request in zip(arrival_times_s(load, len(plan), seed), plan):
                    while time.perf_counter() - started < arrival and not ended_because:
                        ended_because += filter(None, [why_end()])
                        report_done()
                        await asyncio.sleep(min(0.02, max(0.0, arrival - (time.perf_counter() - started))))
                    if ended_because:
                        break
                    tasks.add(asyncio.create_task(one(request)))
            else:
                queue = list(plan)
                tasks.update(asyncio.create_task(closed_loop_user(queue)) for _ in range(int(load)))
            while not ended_because and (pending := [t for t in tasks if not t.done()]):
                ended_because += filter(None, [why_end()])
                # the pending ones only: a done task would wake this at once, a busy loop that takes a core
                # from the server
                await asyncio.wait(pending, timeout=0.02, return_when=asyncio.FIRST_COMPLETED)
                report_done()
            report_done()
            ended_because += filter(None, [why_end()]) if not ended_because else []
            for task in tasks:
                if task.done() and task.exception() is not None:
                    raise task.exception()
        finally:  # a stop, a failure or an exception (a page's rerun) alike: nothing stays in flight
            for task in [*tasks, *([poller] if poller else [])]:
                task.cancel()
            await asyncio.gather(*tasks, *([poller] if poller else []), return_exceptions=True)
    for record in records:
        if record.end_s is None or (record.error is None and record.time_to_first_token_s is None):
            record.error = record.error or "cancelled: the point ended before its answer"
    duration = (
        max([r.end_s for r in records if r.end_s is not None] or [0.0]) - min([r.sent_s for r in records] or [0.0])
    )
    return PointRun(records, duration, peaks, ended_because[0] if ended_because else None)


def run_point(
    client: ServerClient, model: str, mode: str, load: float, plan: list[PlannedRequest], max_tokens: int, **options
) -> PointRun:
    """Run one load point to its end (see the module docstring); blocking, on its own event loop."""
    if mode not in ("rate", "concurrency") or load <= 0:
        raise ProbeError(f"A load point needs mode 'rate' or 'concurrency' and a load above 0, got {mode!r} {load}.")
    return asyncio.run(_run_point(client, model, mode, load, plan, max_tokens, **options))
