"""``python -m prefillviz probe-server --url URL [--model NAME] [--load rate|concurrency] [--json]``: the probe
on the command line.

Without ``--load`` it runs the one-request experiments (``report``); with it, the load sweep (``load_sweep``).
"""

from __future__ import annotations

import argparse
import sys

from prefillviz.loading.hosted import hosted_policy
from prefillviz.probe.client import ProbeBudget
from prefillviz.probe.load_sweep import LoadSettings
from prefillviz.probe.report import EXPERIMENTS, ProbeSettings


def add_parser(commands) -> None:
    probe = commands.add_parser(
        "probe-server", help="measure an OpenAI-compatible server from outside (TTFT vs N, prefix cache, interference)"
    )
    probe.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000 (with or without /v1)")
    probe.add_argument("--model", default=None, help="the served model's name (default: the first one it lists)")
    probe.add_argument("--sizes", default=None,
                       help="comma-separated prompt lengths N (default: 64..4096 up to its context)")
    probe.add_argument("--runs", type=int, default=3, help="requests per size and per prefix check (medians over them)")
    probe.add_argument("--prefix-tokens", type=int, default=None,
                       help="the shared prefix's length (default: half the largest N, at least 512)")
    probe.add_argument("--long-tokens", type=int, default=None,
                       help="the prompt that arrives during the streams (default: the largest N)")
    probe.add_argument("--streams", type=int, default=3, help="streams generating when the long prompt arrives")
    probe.add_argument("--experiments", default=",".join(EXPERIMENTS), help="which of ttft, prefix, interference")
    probe.add_argument("--timeout", type=float, default=60.0,
                       help="seconds of silence from the server before the probe gives up")
    probe.add_argument("--max-requests", type=int, default=200, help="the most requests the probe may send")
    probe.add_argument("--api-key", default=None, help="sent as a bearer token (or set OPENAI_API_KEY)")
    probe.add_argument("--json", action="store_true", help="print one JSON object")
    load = probe.add_argument_group("load sweep (with --load)")
    load.add_argument("--load", choices=("rate", "concurrency"), default=None,
                      help="sweep the load instead: open-loop Poisson arrivals (req/s) or closed-loop users")
    load.add_argument("--loads", default=None,
                      help="comma-separated loads (default: rates as multiples of the one-at-a-time rate, "
                           "or 1,2,4,8,16 users)")
    load.add_argument("--requests-per-point", type=int, default=LoadSettings.requests_per_point)
    load.add_argument("--prompt-tokens", type=int, default=LoadSettings.prompt_tokens, help="the mean prompt length")
    load.add_argument("--prompt-spread", type=float, default=LoadSettings.prompt_spread,
                      help="lengths uniform in mean × [1 - spread, 1 + spread]")
    load.add_argument("--output-tokens", type=int, default=LoadSettings.output_tokens)
    load.add_argument("--prefix-share", type=float, default=0.0,
                      help="the share of requests that start with one shared system prompt")
    load.add_argument("--shared-prefix-tokens", type=int, default=LoadSettings.shared_prefix_tokens)
    load.add_argument("--ttft-target-ms", type=float, default=LoadSettings.ttft_target_s * 1e3,
                      help="goodput: each request's TTFT target")
    load.add_argument("--itl-target-ms", type=float, default=LoadSettings.itl_target_s * 1e3,
                      help="goodput: each request's mean inter-token gap target")
    load.add_argument("--knee-factor", type=float, default=LoadSettings.knee_factor,
                      help="the knee: TTFT p99 beyond this × its low-load level")
    load.add_argument("--max-seconds", type=float, default=LoadSettings.max_seconds, help="the sweep's time bound")


def _numbers(text: str | None, flag: str, kind: type = int) -> tuple | None:
    """``--flag a,b,c`` as a tuple of ``kind`` (int: whole numbers; float: any numbers), None when not given."""
    if text is None:
        return None
    from prefillviz.engine.errors import ConfigError

    try:
        return tuple(kind(n) for n in text.split(",") if n.strip())
    except ValueError:
        what = "whole numbers" if kind is int else "numbers"
        raise ConfigError(f"{flag} must be comma-separated {what}, got {text!r}.") from None


def print_progress(fraction: float, text: str) -> None:
    """A sweep's progress on one stderr line, rewritten in place."""
    print(f"\r{fraction:4.0%} {text[:70]:<70}", end="", file=sys.stderr, flush=True)


def load_command(args: argparse.Namespace, budget: ProbeBudget) -> dict:
    import os

    from prefillviz.probe.load_sweep import load_sweep

    settings = LoadSettings(
        mode=args.load, loads=_numbers(args.loads, "--loads", float), requests_per_point=args.requests_per_point,
        prompt_tokens=args.prompt_tokens, prompt_spread=args.prompt_spread, output_tokens=args.output_tokens,
        shared_prefix_share=args.prefix_share, shared_prefix_tokens=args.shared_prefix_tokens,
        ttft_target_s=args.ttft_target_ms / 1e3, itl_target_s=args.itl_target_ms / 1e3, knee_factor=args.knee_factor,
        max_seconds=args.max_seconds,
    )
    report = load_sweep(args.url, args.model, settings, progress=print_progress, budget=budget,
                        api_key=args.api_key or os.environ.get("OPENAI_API_KEY"), read_timeout_s=args.timeout)
    print(file=sys.stderr)
    if report.stopped_reason:
        print(f"note: {report.stopped_reason}", file=sys.stderr)
    return report.to_json()


def probe_command(args: argparse.Namespace) -> dict:
    import os

    from prefillviz.probe.report import probe_server

    policy = hosted_policy()
    policy.check_probe_url(args.url)
    settings = ProbeSettings(
        sizes=_numbers(args.sizes, "--sizes"), runs=args.runs, prefix_tokens=args.prefix_tokens,
        long_tokens=args.long_tokens,
        num_streams=args.streams, experiments=tuple(e.strip() for e in args.experiments.split(",") if e.strip()),
    )
    budget = ProbeBudget(max_requests=policy.limit("probe_requests", args.max_requests))
    budget.max_prompt_tokens = policy.limit("probe_prompt_tokens", budget.max_prompt_tokens)
    if args.load:
        return load_command(args, budget)
    report = probe_server(
        args.url, args.model, settings, progress=print_progress, budget=budget,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY"), read_timeout_s=args.timeout,
    )
    print(file=sys.stderr)
    return report.to_json()


def _ms(seconds: float | None) -> str:
    return "   —" if seconds is None else f"{seconds * 1e3:7.0f}"


def print_load_summary(result: dict) -> None:
    print(f"one at a time: {result['one_at_a_time_rate']:.3g} req/s · "
          f"knee: {result['knee_load']} ({result['knee_rule']})")
    print("   load  ok/sent  TTFT p50   p90     p99 ms  ITL p50  p99 ms  req/s  prompt tok/s  out tok/s  goodput"
          "  wait+prefill ms  wait share  (w+p)/client, (queue+p)/client")
    for p in result["load_points"]:
        split = p["split"]
        both = None if split["waiting_s_mean"] is None else split["waiting_s_mean"] + split["prefill_s_mean"]
        share = "    —" if split["queue_share"] is None else f"{split['queue_share']:5.0%}"
        ratio = (
            "  —" if split["split_over_client"] is None
            else f"{split['split_over_client']:.2f}/{split['scheduler_queue_plus_prefill_over_client']:.2f}"
        )
        print(f"{p['load']:7.3g}  {p['requests_ok']:>3}/{p['requests_sent']:<3} "
              f"{_ms(p['ttft_s_p50'])} {_ms(p['ttft_s_p90'])} {_ms(p['ttft_s_p99'])}"
              f"  {_ms(p['itl_s_p50'])} {_ms(p['itl_s_p99'])}  {p['requests_per_s'] or 0:5.2f}"
              f"  {p['prompt_tokens_per_s'] or 0:12.0f}"
              f"  {p['output_tokens_per_s'] or 0:9.1f}  {p['goodput_share'] or 0:7.0%}  {_ms(both):>15}"
              f"  {share:>10}  {ratio:>9}")
    print(result["reading"])
    if result["stopped_reason"]:
        print(f"stopped: {result['stopped_reason']}")


def print_summary(result: dict) -> None:
    server = result["server"]
    print(f"server: {server['url']} · {server['model']} · {server.get('version') or 'version not reported'} · "
          f"/metrics: {server['metrics_available']}")
    if "load_points" in result:
        print_load_summary(result)
        return
    for point in result["ttft_by_tokens"]:
        print(f"  N={point['num_tokens']:>6}: TTFT {point['ttft_s_median'] * 1e3:8.1f} ms "
              f"(median of {len(point['runs'])})")
    for key in (
        "prefix_miss_ttft_s", "prefix_hit_ttft_s", "prefix_hit_speedup", "cached_tokens_reported",
        "itl_max_ms_before", "itl_max_ms_during", "ttft_long_ms",
    ):
        print(f"{key}: {result[key]}")
