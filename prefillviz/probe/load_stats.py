"""A load point's figures, the knee of a sweep, and TTFT split into queue and prefill.

``PointResult`` summarizes one load point: time to first token and inter-token latency
percentiles over the requests that succeeded, what was achieved per second, and **goodput**
(the share of requests sent whose TTFT and mean inter-token gap both met the user's targets;
a failed request misses both).

The **split** comes from the server's own histograms, read before and after the point
(``MetricsDelta``): vLLM times each request's prefill (``vllm:request_prefill_time_seconds``:
first scheduled until first token), its wait in the scheduler's queue
(``vllm:request_queue_time_seconds``: queued until first scheduled) and its own TTFT
(``vllm:time_to_first_token_seconds``: arrival at the API server until first token). Their
means per point are ``sum / count`` of the increase. TTFT is split into **waiting** (the
server's TTFT less prefill: arrival until first scheduled) and **prefill**. The waiting has two
parts: the scheduler's queue, and the time before the scheduler saw the request (the server's
TTFT less queue and prefill). The second is not only the API server's parsing and tokenizing:
vLLM's engine core takes new requests between steps (``run_busy_loop``: the input queue, then
one step), so a request that arrives during a long step waits for it to end before it is even
queued, and vLLM's queue histogram does not count that wait. Under load it is a large part of the
waiting. A server without these histograms gets the client's figures and the list of what is missing.

vLLM admits a request into the running batch as soon as the batch has room (sequences, token
budget, KV blocks), so below that its scheduler queue stays near zero and sharing steps with the
other requests shows up as longer prefill; the queue grows once the batch is full.

The **knee** is the highest load whose TTFT p99 stays within ``knee_factor`` times the
lowest load's p99; it is "reached" only when a heavier load went past that line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from prefillviz.probe.load import PointRun
from prefillviz.probe.metrics import MetricsDelta

QUEUE, PREFILL, TTFT = (
    "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds", "vllm:time_to_first_token_seconds"
)
PREFIX_HITS, PREFIX_QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
SPLIT_METRICS = (QUEUE, PREFILL, TTFT)


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def histogram_mean(delta: MetricsDelta, name: str) -> float | None:
    count = delta.get(f"{name}_count")
    return delta.get(f"{name}_sum") / count if count else None


@dataclass
class PointResult:
    mode: str  # "rate" (offered requests/s, open loop) or "concurrency" (users, closed loop)
    load: float
    run: PointRun
    server: MetricsDelta = field(default_factory=MetricsDelta)
    metrics_available: bool = False

    @property
    def ok_records(self):
        return [r for r in self.run.records if r.ok]

    def ttft_s(self, q: float) -> float | None:
        return percentile([r.time_to_first_token_s for r in self.ok_records], q)

    def itl_s(self, q: float) -> float | None:
        return percentile([g for r in self.ok_records for g in r.token_gaps_s], q)

    def per_second(self, amount: float) -> float | None:
        return amount / self.run.duration_s if self.run.duration_s > 0 else None

    def num_good(self, ttft_target_s: float, itl_target_s: float) -> int:
        """Requests that met both targets (the mean gap of a one-token answer counts as 0)."""
        return sum(
            r.time_to_first_token_s <= ttft_target_s and (r.inter_token_s_mean or 0.0) <= itl_target_s
            for r in self.ok_records
        )

    def goodput_share(self, ttft_target_s: float, itl_target_s: float) -> float | None:
        """The share of the requests sent that met both targets."""
        records = self.run.records
        return self.num_good(ttft_target_s, itl_target_s) / len(records) if records else None

    def split(self) -> dict:
        """TTFT as the server timed it: waiting (before the scheduler, then in its queue) + prefill, and what is
        missing."""
        queue, prefill, server_ttft = (histogram_mean(self.server, name) for name in SPLIT_METRICS)
        client = [r.time_to_first_token_s for r in self.ok_records]
        client_mean = sum(client) / len(client) if client else None
        missing = [name for name, value in zip(SPLIT_METRICS, (queue, prefill, server_ttft)) if value is None]
        complete = not missing and self.metrics_available
        waiting = server_ttft - prefill if complete else None
        return {
            "queue_s_mean": queue, "prefill_s_mean": prefill, "server_ttft_s_mean": server_ttft,
            "client_ttft_s_mean": client_mean,
            "waiting_s_mean": waiting,  # arrival until first scheduled
            # the API server, and the engine's step then running
            "before_scheduler_s_mean": waiting - queue if complete else None,
            # waiting's share of the server's TTFT
            "queue_share": waiting / server_ttft if complete and server_ttft else None,
            "split_over_client": (waiting + prefill) / client_mean if complete and client_mean else None,
            "scheduler_queue_plus_prefill_over_client": (
                (queue + prefill) / client_mean if complete and client_mean else None
            ),
            "server_ttft_over_client": server_ttft / client_mean if server_ttft is not None and client_mean else None,
            "prefix_cache_hit_share": self._prefix_hit_share(),
            "missing": missing if self.metrics_available else ["/metrics (the server has none)"],
        }

    def _prefix_hit_share(self) -> float | None:
        hits, queries = self.server.get(PREFIX_HITS), self.server.get(PREFIX_QUERIES)
        return hits / queries if queries else None

    def to_json(self, ttft_target_s: float, itl_target_s: float) -> dict:
        ok = self.ok_records
        errors = [r.error for r in self.run.records if r.error]
        return {
            "mode": self.mode, "load": self.load, "requests_sent": len(self.run.records), "requests_ok": len(ok),
            "errors": len(errors), "first_error": errors[0] if errors else None, "duration_s": self.run.duration_s,
            "ended_because": self.run.ended_because,
            **{f"ttft_s_p{q}": self.ttft_s(q) for q in (50, 90, 99)},
            **{f"itl_s_p{q}": self.itl_s(q) for q in (50, 99)},
            "requests_per_s": self.per_second(len(ok)),
            "prompt_tokens_per_s": self.per_second(sum(r.prompt_tokens or r.target_tokens for r in ok)),
            "output_tokens_per_s": self.per_second(sum(r.output_tokens for r in ok)),
            "goodput_share": self.goodput_share(ttft_target_s, itl_target_s),
            "goodput_per_s": self.per_second(self.num_good(ttft_target_s, itl_target_s)),
            "split": self.split(),
            "gauge_peaks": self.run.gauge_peaks,
            "metrics_delta": self.server.to_json(),
        }


def find_knee(points: list[PointResult], knee_factor: float) -> tuple[int | None, bool]:
    """(index of the highest load within ``knee_factor`` × the lowest load's TTFT p99, whether a heavier one went
    past)."""
    base = points[0].ttft_s(99) if points else None
    if base is None:
        return None, False
    knee = None
    for index, point in enumerate(points):
        p99 = point.ttft_s(99)
        if p99 is None or p99 > knee_factor * base:
            return knee, True
        knee = index
    return knee, False


def unit(mode: str) -> str:
    return "req/s" if mode == "rate" else "concurrent users"


def reading(points: list[PointResult], knee_factor: float) -> str:
    """The sweep in one plain sentence or two: where TTFT is prefill and where it is the queue."""
    if not points:
        return "No load point finished, so there is nothing to read yet."
    knee, reached = find_knee(points, knee_factor)
    what = unit(points[0].mode)
    splits = [p.split() for p in points]
    if all(s["queue_share"] is not None for s in splits):
        first_queue_led = next((i for i, s in enumerate(splits) if s["queue_share"] >= 0.5), None)
        if first_queue_led is None:
            text = (f"Up to {points[-1].load:g} {what} (the heaviest load swept) your TTFT is mostly prefill: "
                    "the queue is under half of it at every point.")
        elif first_queue_led == 0:
            text = (f"Already at {points[0].load:g} {what} (the lightest load swept) half or more of your TTFT "
                    "is waiting in the queue.")
        else:
            first, split = points[first_queue_led], splits[first_queue_led]
            text = (f"Up to {points[first_queue_led - 1].load:g} {what} your TTFT is mostly prefill; "
                    f"beyond it, it is the queue ({split['queue_share']:.0%} of TTFT at {first.load:g} {what}).")
        before = [
            (p, s["before_scheduler_s_mean"] / s["server_ttft_s_mean"])
            for p, s in zip(points, splits) if s["server_ttft_s_mean"]
        ]
        if before and max(share for _, share in before) >= 0.2:
            heaviest, share = max(before, key=lambda pair: pair[1])
            text += (f" At {heaviest.load:g} {what}, {share:.0%} of the server's TTFT passed before its scheduler "
                     "saw the request: its engine takes new requests only between steps, so they wait for the step "
                     "then running (and the API server's work).")
    else:
        missing = sorted({m for s in splits for m in s["missing"]})
        text = (f"The server does not export {', '.join(missing)}, so TTFT can't be split into queue and prefill; "
                "only the client's view is shown.")
    if reached and knee is not None:
        text += (f" TTFT p99 stays within {knee_factor:g}× its low-load level up to {points[knee].load:g} {what}: "
                 "the knee.")
    elif not reached:
        text += (f" TTFT p99 never left {knee_factor:g}× its low-load level: no knee within the loads swept; "
                 "try heavier loads.")
    return text
