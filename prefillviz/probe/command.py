"""``python -m prefillviz probe-server --url URL [--model NAME] [--json]``: the probe on the command line."""

from __future__ import annotations

import argparse
import sys

from prefillviz.loading.hosted import hosted_policy
from prefillviz.probe.client import ProbeBudget
from prefillviz.probe.report import EXPERIMENTS, ProbeSettings


def add_parser(commands) -> None:
    probe = commands.add_parser("probe-server", help="measure an OpenAI-compatible server from outside (TTFT vs N, prefix cache, interference)")
    probe.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000 (with or without /v1)")
    probe.add_argument("--model", default=None, help="the served model's name (default: the first one it lists)")
    probe.add_argument("--sizes", default=None, help="comma-separated prompt lengths N (default: 64..4096 up to its context)")
    probe.add_argument("--runs", type=int, default=3, help="requests per size and per prefix check (medians over them)")
    probe.add_argument("--prefix-tokens", type=int, default=None, help="the shared prefix's length (default: half the largest N, at least 512)")
    probe.add_argument("--long-tokens", type=int, default=None, help="the prompt that arrives during the streams (default: the largest N)")
    probe.add_argument("--streams", type=int, default=3, help="streams generating when the long prompt arrives")
    probe.add_argument("--experiments", default=",".join(EXPERIMENTS), help="which of ttft, prefix, interference")
    probe.add_argument("--timeout", type=float, default=60.0, help="seconds of silence from the server before the probe gives up")
    probe.add_argument("--max-requests", type=int, default=200, help="the most requests the probe may send")
    probe.add_argument("--api-key", default=None, help="sent as a bearer token (or set OPENAI_API_KEY)")
    probe.add_argument("--json", action="store_true", help="print one JSON object")


def _numbers(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    from prefillviz.engine.errors import ConfigError

    try:
        return tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        raise ConfigError(f"{flag} must be comma-separated whole numbers, got {text!r}.") from None


def probe_command(args: argparse.Namespace) -> dict:
    import os

    from prefillviz.probe.report import probe_server

    policy = hosted_policy()
    policy.check_probe_url(args.url)
    settings = ProbeSettings(
        sizes=_numbers(args.sizes, "--sizes"), runs=args.runs, prefix_tokens=args.prefix_tokens, long_tokens=args.long_tokens,
        num_streams=args.streams, experiments=tuple(e.strip() for e in args.experiments.split(",") if e.strip()),
    )
    budget = ProbeBudget(max_requests=policy.limit("probe_requests", args.max_requests))
    budget.max_prompt_tokens = policy.limit("probe_prompt_tokens", budget.max_prompt_tokens)

    def progress(fraction: float, text: str) -> None:
        print(f"\r{fraction:4.0%} {text[:70]:<70}", end="", file=sys.stderr, flush=True)

    report = probe_server(
        args.url, args.model, settings, progress=progress, budget=budget,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY"), read_timeout_s=args.timeout,
    )
    print(file=sys.stderr)
    return report.to_json()


def print_summary(result: dict) -> None:
    server = result["server"]
    print(f"server: {server['url']} · {server['model']} · {server.get('version') or 'version not reported'} · /metrics: {server['metrics_available']}")
    for point in result["ttft_by_tokens"]:
        print(f"  N={point['num_tokens']:>6}: TTFT {point['ttft_s_median'] * 1e3:8.1f} ms (median of {len(point['runs'])})")
    for key in ("prefix_miss_ttft_s", "prefix_hit_ttft_s", "prefix_hit_speedup", "cached_tokens_reported", "itl_max_ms_before", "itl_max_ms_during", "ttft_long_ms"):
        print(f"{key}: {result[key]}")
