"""``load_sweep``: a server under increasing load, and whether its TTFT is prefill or the queue.

It asks the server what it is, sizes prompts with one calibration request, then sends
``WARMUP_REQUESTS`` requests one at a time: they warm the server up and measure the rate it
serves one at a time (``1 / latency``). Open-loop loads default to multiples of that rate, so
the sweep crosses the knee on a laptop and on a GPU alike. Each load point then runs
``requests_per_point`` streamed requests (fewer, down to ``MIN_REQUESTS_PER_POINT``, for a light
open-loop load whose arrivals would not fit its share of the time left; ``load.run_point``) with
the server's ``/metrics`` read before and after it (``load_stats``).

Bounded before it starts: the plan's requests, prompt tokens and new tokens are checked
against the ``ProbeBudget`` and refused whole when over it, and the sweep has a deadline
(``max_seconds``). It stops at the first point whose errors exceed ``max_error_share``, at the
deadline, at ``should_stop()``, and ``points_past_knee`` points after the knee; the points
finished before stay in the report with the reason it stopped.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from prefillviz.machine.progress import FractionProgress, ProgressCounter
from prefillviz.probe.client import ProbeBudget, ProbeError, ServerClient
from prefillviz.probe.load import PlannedRequest, run_point
from prefillviz.probe.load_stats import QUEUE, PointResult, find_knee, reading
from prefillviz.probe.metrics import MetricsDelta, parse_metrics
from prefillviz.probe.prompts import PromptMaker, calibration_prompt
from prefillviz.probe.report import DEFAULT_CONTEXT, server_info

WARMUP_REQUESTS = 3
RATE_MULTIPLES = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)  # × the rate served one at a time
DEFAULT_CONCURRENCIES = (1, 2, 4, 8, 16)
MIN_REQUESTS_PER_POINT = 4
METRICS_SETTLE_S = 3.0  # the longest wait for the server's histograms to count the point's requests


@dataclass
class LoadSettings:
    mode: str = "rate"  # "rate": open loop, Poisson arrivals (req/s); "concurrency": closed loop (users)
    loads: tuple[float, ...] | None = None  # None: RATE_MULTIPLES × the one-at-a-time rate, or DEFAULT_CONCURRENCIES
    requests_per_point: int = 12
    prompt_tokens: int = 256  # the mean prompt length
    prompt_spread: float = 0.5  # prompt lengths uniform in prompt_tokens × [1 - spread, 1 + spread]
    output_tokens: int = 8
    shared_prefix_share: float = 0.0  # the share of requests that start with one shared system prompt
    shared_prefix_tokens: int = 128
    ttft_target_s: float = 1.0  # goodput: a request is good when its TTFT and mean inter-token gap meet both
    itl_target_s: float = 0.25
    knee_factor: float = 2.0
    max_error_share: float = 0.1
    max_seconds: float = 170.0
    points_past_knee: int = 1
    seed: int = 0

    def check(self) -> None:
        problems = [
            what for what, bad in (
                (f"mode {self.mode!r} (rate or concurrency)", self.mode not in ("rate", "concurrency")),
                ("loads above 0", self.loads is not None and (not self.loads or min(self.loads) <= 0)),
                ("at least 2 requests per point", self.requests_per_point < 2),
                ("prompts of at least 16 tokens", self.prompt_tokens < 16),
                ("a prompt spread from 0 to 0.9", not 0 <= self.prompt_spread <= 0.9),
                ("at least 1 output token", self.output_tokens < 1),
                ("a shared-prefix share from 0 to 1", not 0 <= self.shared_prefix_share <= 1),
                ("a knee factor above 1", self.knee_factor <= 1),
                ("an error share from 0 to 1", not 0 <= self.max_error_share < 1),
                ("a time bound above 0", self.max_seconds <= 0),
            ) if bad
        ]
        if problems:
            raise ProbeError(f"Impossible load settings: the sweep needs {'; '.join(problems)}.")


@dataclass
class LoadReport:
    server: dict
    settings: LoadSettings
    one_at_a_time_rate: float | None = None  # requests/s served one at a time (the warm-up's)
    points: list[PointResult] = field(default_factory=list)
    stopped_reason: str | None = None
    requests_sent: int = 0
    prompt_tokens_sent: int = 0
    seconds: float = 0.0

    def knee(self) -> tuple[int | None, bool]:
        return find_knee(self.points, self.settings.knee_factor)

    def reading(self) -> str:
        return reading(self.points, self.settings.knee_factor)

    def to_json(self) -> dict:
        settings = self.settings
        knee, reached = self.knee()
        return {
            "server": self.server, "settings": asdict(settings), "one_at_a_time_rate": self.one_at_a_time_rate,
            "load_points": [p.to_json(settings.ttft_target_s, settings.itl_target_s) for p in self.points],
            "knee_load": self.points[knee].load if knee is not None and reached else None,
            "knee_reached": reached,
            "knee_rule": f"the highest load whose TTFT p99 stays within {settings.knee_factor:g}× the lowest load's",
            "reading": self.reading(), "stopped_reason": self.stopped_reason,
            "requests_sent": self.requests_sent, "prompt_tokens_sent": self.prompt_tokens_sent,
            "seconds": round(self.seconds, 2),
        }


def requests_at(settings: LoadSettings, load: float) -> int:
    """A point's requests: ``requests_per_point``, and at least one per user in a closed loop."""
    return (
        max(settings.requests_per_point, int(load)) if settings.mode == "concurrency" else settings.requests_per_point
    )


def check_bounds(settings: LoadSettings, loads: tuple[float, ...], budget: ProbeBudget) -> None:
    """Refuse the whole sweep before it starts when its plan would go over ``budget``."""
    requests = sum(requests_at(settings, load) for load in loads) + WARMUP_REQUESTS + 1
    prompt_tokens = requests * math.ceil(settings.prompt_tokens * (1 + settings.prompt_spread))
    new_tokens = requests * settings.output_tokens
    over = [f"{what} ({planned:,} > {limit:,})" for what, planned, limit in (
        ("requests", requests, budget.max_requests), ("prompt tokens", prompt_tokens, budget.max_prompt_tokens),
        ("new tokens", new_tokens, budget.max_new_tokens)) if planned > limit]
    if over:
        raise ProbeError(f"The sweep would go over its bounds: {', '.join(over)}. Send fewer requests per point, "
                         "fewer loads, shorter prompts or fewer output tokens.")


def plan_requests(
    settings: LoadSettings, maker: PromptMaker, shared_prefix: str, rng: random.Random, num_requests: int
) -> list[PlannedRequest]:
    """One point's prompts: lengths from the chosen distribution, some behind the shared prefix."""
    plan = []
    for _ in range(num_requests):
        spread = settings.prompt_tokens * settings.prompt_spread
        num_tokens = max(16, round(rng.uniform(settings.prompt_tokens - spread, settings.prompt_tokens + spread)))
        if rng.random() < settings.shared_prefix_share:
            suffix_tokens = max(8, num_tokens - settings.shared_prefix_tokens)
            plan.append(PlannedRequest(
                shared_prefix + maker.suffix(suffix_tokens), settings.shared_prefix_tokens + suffix_tokens, True
            ))
        else:
            plan.append(PlannedRequest(maker.prompt(num_tokens), num_tokens, False))
    return plan


def _snapshot(client: ServerClient, info: dict) -> dict[str, float] | None:
    text = client.metrics_text() if info["metrics_available"] else None
    return parse_metrics(text) if text else None


def _settled_snapshot(
    client: ServerClient, info: dict, before: dict | None, num_finished: int
) -> dict[str, float] | None:
    """The snapshot after a point, once the server's queue histogram has counted its finished requests
    (bounded wait)."""
    deadline = time.monotonic() + METRICS_SETTLE_S
    while True:
        after = _snapshot(client, info)
        counted = MetricsDelta.between(before, after).get(f"{QUEUE}_count")
        if after is None or QUEUE + "_count" not in after or counted >= num_finished or time.monotonic() > deadline:
            return after
        time.sleep(0.1)


def load_sweep(
    url: str, model: str | None = None, settings: LoadSettings | None = None, progress: FractionProgress | None = None,
    budget: ProbeBudget | None = None, api_key: str | None = None, read_timeout_s: float | None = None,
    should_stop: Callable[[], bool] | None = None, on_point: Callable[[LoadReport], None] | None = None,
) -> LoadReport:
    """Sweep the load on the server at ``url``; ``on_point`` sees the report after each point.

    Raises ``ProbeError`` when the server can't be probed at all or the plan is over its bounds;
    a failure during the sweep ends it with ``stopped_reason`` and keeps the points before.
    """
    settings = settings or LoadSettings()
    settings.check()
    should_stop = should_stop or (lambda: False)
    started = time.monotonic()
    timeouts = {"read_timeout_s": read_timeout_s} if read_timeout_s else {}
    with ServerClient(url, api_key=api_key, budget=budget, **timeouts) as client:
        info = server_info(client, model)
        loads = settings.loads or (RATE_MULTIPLES if settings.mode == "rate" else DEFAULT_CONCURRENCIES)
        check_bounds(settings, tuple(loads), client.budget)
        context = info["max_model_len"] or DEFAULT_CONTEXT
        longest = math.ceil(settings.prompt_tokens * (1 + settings.prompt_spread)) + settings.output_tokens
        if longest > context * 0.9 or settings.shared_prefix_tokens + 8 > context * 0.9:
            raise ProbeError(
                f"The longest request ({longest} tokens with its answer) does not fit this server's context "
                f"of {context} tokens."
            )
        text, num_words = calibration_prompt(settings.seed)
        maker = PromptMaker(max(client.count_prompt_tokens(info["model"], text) - 6, 1) / num_words, seed=settings.seed)
        info["tokens_per_word"] = round(maker.tokens_per_word, 4)
        report = LoadReport(server=info, settings=settings)
        latencies = []
        for _ in range(WARMUP_REQUESTS):
            answer = client.stream_completion(
                info["model"], maker.prompt(settings.prompt_tokens), settings.output_tokens, settings.prompt_tokens
            )
            if not answer.token_times_s:
                raise ProbeError(
                    f"The server streamed no token for a warm-up request (finish reason {answer.finish_reason!r})."
                )
            latencies.append(answer.token_times_s[-1] - answer.sent_s)
        report.one_at_a_time_rate = 1.0 / statistics.median(latencies[1:])
        if settings.loads is None and settings.mode == "rate":
            loads = tuple(float(f"{m * report.one_at_a_time_rate:.3g}") for m in RATE_MULTIPLES)

        shared_prefix = maker.prompt(settings.shared_prefix_tokens)
        rng = random.Random(settings.seed)
        counter = ProgressCounter(progress, sum(requests_at(settings, load) for load in loads))
        past_knee = 0
        for index, load in enumerate(loads):
            left_s = settings.max_seconds - (time.monotonic() - started)
            if should_stop():
                report.stopped_reason = "Stopped by the user."
                break
            num_requests = requests_at(settings, load)
            # a light load gets fewer requests when all of them would not arrive within its share of the time left
            if settings.mode == "rate":
                share_s = left_s / (len(loads) - index)
                num_requests = min(num_requests, max(MIN_REQUESTS_PER_POINT, math.floor(load * share_s * 0.7)))
            arrivals_s = num_requests / load if settings.mode == "rate" else 0.0  # open loop: sending alone takes this
            if left_s <= 1 or arrivals_s > left_s:
                report.stopped_reason = (f"The sweep stopped before load {load:g}: it would take over "
                                         f"{arrivals_s:.0f} s, and {max(left_s, 0):.0f} s are left of its time "
                                         f"bound of {settings.max_seconds:.0f} s.")
                break
            label = f"load {load:g} {'req/s' if settings.mode == 'rate' else 'users'} ({index + 1} of {len(loads)})"
            counter.advance(label, units=0)
            before = _snapshot(client, info)
            run = run_point(
                client, info["model"], settings.mode, load,
                plan_requests(settings, maker, shared_prefix, rng, num_requests), settings.output_tokens,
                max_errors=math.floor(settings.max_error_share * num_requests), deadline_s=left_s,
                request_deadline_s=client.request_deadline_s, seed=settings.seed + index,
                poll_metrics=before is not None,
                should_stop=should_stop, on_done=lambda record: counter.advance(label),
            )
            ok = sum(r.ok for r in run.records)
            after = _settled_snapshot(client, info, before, ok)
            point = PointResult(
                settings.mode, load, run, MetricsDelta.between(before, after), metrics_available=before is not None
            )
            if run.ended_because is not None:
                kept = f"the {len(report.points)} load point(s) before it are kept"
                if "stopped by the user" in run.ended_because:
                    report.stopped_reason = f"Stopped by the user during load {load:g}; {kept}."
                elif "time bound" in run.ended_because:
                    report.stopped_reason = (f"The sweep reached its time bound of {settings.max_seconds:.0f} s "
                                             f"during load {load:g}; {kept}.")
                else:
                    report.stopped_reason = (f"The server started failing at load {load:g}: {run.ended_because}. "
                                             f"The sweep stopped; {kept}.")
                break
            report.points.append(point)
            report.requests_sent, report.prompt_tokens_sent = (
                client.budget.num_requests, client.budget.num_prompt_tokens
            )
            report.seconds = time.monotonic() - started
            if on_point is not None:
                on_point(report)
            knee, reached = report.knee()
            past_knee = past_knee + 1 if reached else 0
            if reached and past_knee >= settings.points_past_knee and index + 1 < len(loads):
                report.stopped_reason = (f"Past the knee: TTFT p99 left {settings.knee_factor:g}× its low-load level; "
                                         "heavier loads were not sent.")
                break
        report.requests_sent, report.prompt_tokens_sent = client.budget.num_requests, client.budget.num_prompt_tokens
        report.seconds = time.monotonic() - started
        return report
