"""``probe_server``: every experiment on one server, and the one report the CLI and the page show.

It first asks the server what it is (``/v1/models``, ``/version``, its ``Server`` header,
whether it has ``/metrics``), sizes prompts with one calibration request, warms the server
up (two requests nobody sees), then runs the experiments. The server's own counters are read
before and after each experiment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prefillviz.experiments.length_sweep import QuadraticFit, fit_quadratic
from prefillviz.machine.progress import FractionProgress, ProgressCounter
from prefillviz.probe.client import ProbeBudget, ProbeError, ServerClient
from prefillviz.probe.experiments import (
    STREAM_PROMPT_TOKENS,
    SUFFIX_TOKENS,
    InterferenceResult,
    PrefixResult,
    TTFTPoint,
    interference,
    prefix_check,
    ttft_sweep,
)
from prefillviz.probe.metrics import MetricsDelta, parse_metrics
from prefillviz.probe.prompts import PromptMaker, calibration_prompt

DEFAULT_SIZES = (64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_CONTEXT = 2048  # when the server does not say its context length
EXPERIMENTS = ("ttft", "prefix", "interference")
WHAT_OUTSIDE_CAN_MEASURE = (
    "From outside, the probe sees what a client sees: when each streamed token arrives (so time to first "
    "token and the gaps between tokens, network included), how many prompt tokens the server counted and, "
    "where it says so, how many it served from its cache, and the counters the server itself exports at "
    "/metrics. It can't see inside a step: no per-layer times, no attention, no KV blocks, no schedule, and "
    "no way to tell queueing from compute except through the server's own counters. Other users' traffic on "
    "a shared server shows up as noise."
)


@dataclass
class ProbeSettings:
    sizes: tuple[int, ...] | None = None  # None: DEFAULT_SIZES up to the server's context
    runs: int = 3
    prefix_tokens: int | None = None  # None: half the largest size
    long_tokens: int | None = None  # the interfering prompt; None: the largest size
    num_streams: int = 3
    max_stream_tokens: int = 512
    experiments: tuple[str, ...] = EXPERIMENTS


@dataclass
class ProbeReport:
    server: dict
    ttft: list[TTFTPoint] = field(default_factory=list)
    ttft_fit: QuadraticFit | None = None
    prefix: PrefixResult | None = None
    interference: InterferenceResult | None = None
    metrics: dict[str, MetricsDelta] = field(default_factory=dict)  # experiment -> what the server counted
    requests_sent: int = 0
    prompt_tokens_sent: int = 0

    def metrics_delta(self) -> dict:
        return {name: delta.to_json() for name, delta in self.metrics.items()}

    def client_ttft_s_mean(self) -> float | None:
        """The sweep's time to first token as this client saw it, every run (network included)."""
        runs = [t for point in self.ttft for t in point.runs]
        return sum(runs) / len(runs) if runs else None

    def server_ttft_s_mean(self) -> float | None:
        """The sweep's time to first token as the server timed it (vLLM's histogram: sum / count), no network."""
        delta = self.metrics.get("ttft")
        count = delta.get("vllm:time_to_first_token_seconds_count") if delta else 0.0
        return delta.get("vllm:time_to_first_token_seconds_sum") / count if count else None

    def to_json(self) -> dict:
        def number(value: float | None) -> float | None:
            return None if value is None or (isinstance(value, float) and math.isnan(value)) else round(value, 6)

        fit = self.ttft_fit
        return {
            "server": self.server,
            "ttft_by_tokens": [p.to_json() for p in self.ttft],
            "server_ttft_s_mean": number(self.server_ttft_s_mean()),
            "client_ttft_s_mean": number(self.client_ttft_s_mean()),
            "ttft_fit": None if fit is None else {
                "a_s": fit.a_s, "b_s_per_token": fit.b_s_per_token, "c_s_per_token2": fit.c_s_per_token2,
                "r_squared": fit.r_squared,
            },
            "prefix_tokens": self.prefix.prefix_tokens if self.prefix else None,
            "prefix_miss_ttft_s": number(self.prefix.miss_ttft_s) if self.prefix else None,
            "prefix_hit_ttft_s": number(self.prefix.hit_ttft_s) if self.prefix else None,
            "prefix_hit_speedup": number(self.prefix.speedup) if self.prefix else None,
            "cached_tokens_reported": self.prefix.cached_tokens_reported if self.prefix else None,
            "itl_max_ms_before": number(self.interference.itl_max_ms(during=False)) if self.interference else None,
            "itl_max_ms_during": number(self.interference.itl_max_ms(during=True)) if self.interference else None,
            "ttft_long_ms": number(self.interference.ttft_long_s * 1e3) if self.interference else None,
            "long_prompt_tokens": self.interference.long_prompt_tokens if self.interference else None,
            "metrics_delta": self.metrics_delta(),
            "requests_sent": self.requests_sent,
            "prompt_tokens_sent": self.prompt_tokens_sent,
        }


def server_info(client: ServerClient, model: str | None) -> dict:
    """What the server says about itself; raises ``ProbeError`` when it is not OpenAI-compatible or lacks ``model``."""
    models = client.models()
    chosen = client.choose_model(models, model)
    version = client.get_optional("/version")
    try:
        version_text = version.json().get("version") if version is not None else None
    except ValueError:
        version_text = None
    return {
        "url": client.url,
        "model": chosen["id"],
        "models": [m["id"] for m in models],
        "owned_by": chosen.get("owned_by"),
        "max_model_len": chosen.get("max_model_len") if isinstance(chosen.get("max_model_len"), int) else None,
        "version": version_text,
        "server_header": client.server_header,
        "metrics_available": client.metrics_text() is not None,
    }


def planned_sizes(settings: ProbeSettings, context: int) -> list[int]:
    """The sweep's sizes: those asked for (or the defaults) that fit the context with room to spare."""
    usable = int(context * 0.9) - SUFFIX_TOKENS
    sizes = sorted({int(n) for n in (settings.sizes or DEFAULT_SIZES) if 8 <= int(n) <= usable})
    if settings.sizes is None and len(sizes) < 3:
        sizes = sorted({max(8, usable // 4), max(8, usable // 2), usable})
    if not sizes:
        raise ProbeError(
            f"No prompt size fits this server's context of {context} tokens; pick sizes from 8 to {usable}."
        )
    return sizes


def _snapshot(client: ServerClient, info: dict) -> dict[str, float] | None:
    text = client.metrics_text() if info["metrics_available"] else None
    return parse_metrics(text) if text else None


def probe_server(
    url: str, model: str | None = None, settings: ProbeSettings | None = None, progress: FractionProgress | None = None,
    budget: ProbeBudget | None = None, api_key: str | None = None, read_timeout_s: float | None = None,
) -> ProbeReport:
    """Run the chosen experiments on the server at ``url``; raises ``ProbeError`` with a reason on any failure."""
    settings = settings or ProbeSettings()
    unknown = set(settings.experiments) - set(EXPERIMENTS)
    if unknown or settings.runs < 1 or settings.num_streams < 1:
        raise ProbeError(
            f"Impossible probe settings: experiments {sorted(unknown) or 'ok'}, runs {settings.runs}, "
            f"streams {settings.num_streams}."
        )
    timeouts = {"read_timeout_s": read_timeout_s} if read_timeout_s else {}
    with ServerClient(url, api_key=api_key, budget=budget, **timeouts) as client:
        info = server_info(client, model)
        context = info["max_model_len"] or DEFAULT_CONTEXT
        sizes = planned_sizes(settings, context)
        prefix_tokens = min(settings.prefix_tokens or max(sizes[-1] // 2, 512), int(context * 0.9) - 2 * SUFFIX_TOKENS)
        long_tokens = min(settings.long_tokens or sizes[-1], int(context * 0.9))
        text, num_words = calibration_prompt()
        tokens = client.count_prompt_tokens(info["model"], text)
        maker = PromptMaker(max(tokens - 6, 1) / num_words)
        info["tokens_per_word"] = round(maker.tokens_per_word, 4)
        for _ in range(2):  # warm-up: the figures below are warm
            client.stream_completion(info["model"], maker.prompt(sizes[0]), 1, sizes[0])

        plan = {"ttft": len(sizes) * settings.runs, "prefix": 2 * settings.runs, "interference": 2}
        counter = ProgressCounter(progress, sum(plan[e] for e in settings.experiments))
        report = ProbeReport(server=info)
        for experiment in EXPERIMENTS:
            if experiment not in settings.experiments:
                continue
            before = _snapshot(client, info)
            if experiment == "ttft":
                report.ttft = ttft_sweep(client, info["model"], maker, sizes, settings.runs, counter)
                if len(report.ttft) >= 3:
                    report.ttft_fit = fit_quadratic(
                        [p.num_tokens for p in report.ttft], [p.ttft_s_median for p in report.ttft]
                    )
            elif experiment == "prefix":
                report.prefix = prefix_check(client, info["model"], maker, prefix_tokens, settings.runs, counter)
            else:
                report.interference = interference(
                    client, info["model"], maker, long_tokens, settings.num_streams,
                    max(settings.max_stream_tokens, STREAM_PROMPT_TOKENS), counter,
                )
            report.metrics[experiment] = MetricsDelta.between(before, _snapshot(client, info))
        report.requests_sent = client.budget.num_requests
        report.prompt_tokens_sent = client.budget.num_prompt_tokens
        return report
