"""The live record behind ``/prefillviz/steps``: recent steps, and each finished request's TTFT split.

Each step as the scheduler filled it: its token budget, the chunks in batch order (a prefill chunk or a
decode, per request), KV blocks in use and prefix-cache hits. For each finished request, its time to
first token split exactly (the parts add up to it) along the engine's own step clock:

    received        first scheduled                                   first token
       |---- queue ----|-- rode: steps with its prefill chunks (and the decodes beside them) --|
                       |-- sat out: steps it was scheduled before but had no chunk in --------|
                       |-- between steps: the loop's own work (handing tokens out, admitting) -|

Each request carries the tag its client gave it (OpenAI's ``user``, e.g. "student 7" from a class room's
*Send*): a step lists the tags of the requests in it, a finished request its own, so every viewer can tell
whose request is whose.

The recorder times itself (``cost_s``, on the engine thread) and the reads it answers (``read_s``, on the HTTP
thread, where they hold the GIL the engine thread also needs), so what watching costs is a measured figure.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from prefillviz.engine.request import Request
from prefillviz.engine.trace import StepRecord

KEEP_STEPS = 600
KEEP_REQUESTS = 200
SAME_TIME_S = 1e-9  # a step's start as the trace writes it, back on the absolute clock


@dataclass
class _Waiting:
    """What one request's steps added up to before its first token."""

    rode_s: float = 0.0
    sat_out_s: float = 0.0
    num_prefill_steps: int = 0
    decodes_beside: int = 0  # other requests' decode tokens in the steps it rode


class LiveRecorder:
    """Kept by the engine thread, read by the HTTP handlers (under one lock)."""

    def __init__(self, token_budget: int, num_blocks: int) -> None:
        self.token_budget, self.num_blocks = token_budget, num_blocks
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._steps: deque[dict] = deque(maxlen=KEEP_STEPS)
        self._requests: deque[dict] = deque(maxlen=KEEP_REQUESTS)
        self._waiting: dict[str, _Waiting] = {}
        self._users: dict[str, str] = {}  # the tags of the requests not yet let go (engine thread only)
        self.num_steps = 0
        self.cost_s = 0.0  # time spent recording, on the engine thread
        self.step_time_s = 0.0  # the recorded steps' own wall time, to compare with
        self.read_s = 0.0  # time the HTTP thread spent answering reads (snapshot + JSON), holding the GIL
        self.num_reads = 0

    def received(self, request_id: str, user: str | None) -> None:
        """A request joined the engine (engine thread), tagged ``user`` by its client (None: untagged)."""
        if user:
            self._users[request_id] = user

    def record_step(self, record: StepRecord, engine, requests: Iterable[Request]) -> None:
        """One step, after it ran (``requests``: every request the server has not yet let go)."""
        began = time.perf_counter()
        start = engine.start_time + record.start_time_s
        in_step = {chunk.request_id: chunk for chunk in record.chunks}
        num_decodes = sum(not chunk.is_prefill for chunk in record.chunks)
        for request in requests:
            scheduled = request.first_scheduled_time is not None and request.first_scheduled_time <= start + SAME_TIME_S
            before_first = request.first_token_time is None or request.first_token_time >= start - SAME_TIME_S
            if not (scheduled and before_first):
                continue
            waiting = self._waiting.setdefault(request.request_id, _Waiting())
            chunk = in_step.get(request.request_id)
            if chunk is None:
                waiting.sat_out_s += record.wall_time_s
                continue
            sampled_here = request.request_id in record.sampled_token_ids and request.first_token_time is not None
            waiting.rode_s += record.wall_time_s - (record.update_time_s if sampled_here else 0.0)
            waiting.num_prefill_steps += 1
            waiting.decodes_beside += num_decodes - (not chunk.is_prefill)
        step = {
            "index": self.num_steps,
            "start_s": round(start - self.t0, 6),
            "wall_s": record.wall_time_s,
            "forward_s": record.forward_time_s,
            "chunks": [[c.request_id, c.num_tokens, c.is_prefill] for c in record.chunks],
            "users": {c.request_id: self._users[c.request_id] for c in record.chunks if c.request_id in self._users},
            "blocks_in_use": self.num_blocks - record.num_free_blocks,
            "blocks_hit": sum(len(blocks) for blocks in record.blocks_hit.values()),
            "preempted": list(record.preempted_request_ids),
        }
        with self._lock:
            self._steps.append(step)
            self.num_steps += 1
            self.step_time_s += record.wall_time_s
            self.cost_s += time.perf_counter() - began

    def finished(self, request: Request, received_time: float) -> None:
        """A request the server let go: its TTFT split (None parts when it had no first token)."""
        began = time.perf_counter()
        waiting = self._waiting.pop(request.request_id, _Waiting())
        split = {"request_id": request.request_id, "user": self._users.pop(request.request_id, None),
                 "status": request.status.value,
                 "num_prompt_tokens": request.num_prompt_tokens, "num_cached_tokens": request.num_cached_tokens,
                 "num_output_tokens": len(request.output_token_ids), "received_s": round(received_time - self.t0, 6),
                 "ttft_s": None}
        if request.first_token_time is not None and request.first_scheduled_time is not None:
            ttft = request.first_token_time - received_time
            queue = request.first_scheduled_time - received_time
            split |= {"ttft_s": ttft, "queue_s": queue, "rode_s": waiting.rode_s, "sat_out_s": waiting.sat_out_s,
                      "between_steps_s": ttft - queue - waiting.rode_s - waiting.sat_out_s,
                      "num_prefill_steps": waiting.num_prefill_steps, "decodes_beside": waiting.decodes_beside}
        with self._lock:
            self._requests.append(split)
            self.cost_s += time.perf_counter() - began

    def snapshot(self, since_step: int = 0) -> dict:
        """The steps numbered ``since_step`` and later still kept, the recent finished requests, and the cost."""
        with self._lock:
            steps = [step for step in self._steps if step["index"] >= since_step]
            requests = list(self._requests)
            num_steps, cost_s, step_time_s = self.num_steps, self.cost_s, self.step_time_s
            read_s, num_reads = self.read_s, self.num_reads
        return {
            "token_budget": self.token_budget,
            "num_blocks": self.num_blocks,
            "num_steps": num_steps,
            "steps": steps,
            "requests": requests,
            "recording_cost_s": cost_s,
            "recorded_step_time_s": step_time_s,
            "recording_cost_fraction": cost_s / step_time_s if step_time_s else None,
            "read_cost_s": read_s,  # the reads before this one
            "num_reads": num_reads,
        }

    def count_read(self, seconds: float) -> None:
        """One read answered (``seconds``: building its snapshot and JSON, on the HTTP thread)."""
        with self._lock:
            self.read_s += seconds
            self.num_reads += 1
