"""Our server and real ``vllm serve`` under the same ``--load rate`` sweep: each one's knee, TTFT and
throughput per load, side by side (``serve_side_by_side_table`` prints them).

    python -m prefillviz.measure.serve_side_by_side [--loads 0.5,1,2,4] [--dtype float32] [--json]
                                                    (make serve-vs-vllm)

Both serve the bundled model in the same dtype with the same scheduler limits (requests running at
once, tokens per step) on 127.0.0.1, each on a free port. They run one after the other, never both at
once: on a small CPU one would take the other's cores. Each gets the probe's sweep (``probe.load_sweep``)
with the same settings, so the same loads, prompts and Poisson arrivals (one seed), and is then stopped
whole (``peers.server_process``), on an error or Ctrl-C too.

The machine may be shared, so each sweep records how busy it was: the 1-minute load average before and
after, and the CPU other processes used meanwhile (``machine.load``, less the server's own).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from prefillviz.engine.errors import PrefillVizError
from prefillviz.machine.load import BUSY_PERCENT, MachineLoad
from prefillviz.measure.serve_knees import comparison, knee_of
from prefillviz.measure.serve_side_by_side_table import side_by_side_table
from prefillviz.peers.server_process import ServerProcess, free_port
from prefillviz.peers.vllm_client import VLLMUnavailable
from prefillviz.peers.vllm_server import LocalVLLMServer, serve_device_problem, write_model_folder
from prefillviz.probe.command import print_progress
from prefillviz.probe.load_sweep import LoadReport, LoadSettings, load_sweep

DEFAULT_LOADS = (0.5, 1.0, 2.0, 4.0)
OUR_START_TIMEOUT_S = 300.0  # the model's load and the engine's warm-up
READ_TIMEOUT_S = 60.0
SERVERS = ("ours", "vllm")
POINT_KEYS = (
    "load", "requests_sent", "requests_ok", "errors", "first_error", "requests_per_s", "output_tokens_per_s",
    "prompt_tokens_per_s", "ttft_s_p50", "ttft_s_p90", "ttft_s_p99", "itl_s_p50", "itl_s_p99", "goodput_share",
    "gauge_peaks",
)
SPLIT_KEYS = ("waiting_s_mean", "queue_s_mean", "prefill_s_mean", "server_ttft_s_mean", "queue_share", "missing")


@dataclass
class ServerLimits:
    """What both servers are given alike."""

    dtype: str = "float32"
    max_num_seqs: int = 16  # requests running at once
    token_budget: int = 2048  # tokens per step (vLLM's max_num_batched_tokens)


@dataclass
class ServerSweep:
    """One server's part of the run: how it was started, its sweep, and how busy the machine was meanwhile."""

    name: str
    command: list[str] = field(default_factory=list)
    pid: int | None = None  # its process group's id (stopped whole)
    start_s: float | None = None
    report: LoadReport | None = None
    machine: dict | None = None
    error: str | None = None


def our_server(limits: ServerLimits) -> ServerProcess:
    """``python -m prefillviz serve`` with the bundled model, on a free port."""
    port = free_port()
    command = [
        sys.executable, "-m", "prefillviz", "serve", "--port", str(port), "--dtype", limits.dtype,
        "--max-num-seqs", str(limits.max_num_seqs), "--token-budget", str(limits.token_budget),
    ]
    return ServerProcess(command, port, "/health", "prefillviz serve", OUR_START_TIMEOUT_S)


def vllm_server(limits: ServerLimits) -> LocalVLLMServer:
    """Real ``vllm serve`` with the bundled model, on a free port."""
    write_model_folder(progress=lambda message: print(message, file=sys.stderr))
    return LocalVLLMServer(dtype=limits.dtype, extra_args=(
        "--max-num-seqs", str(limits.max_num_seqs), "--max-num-batched-tokens", str(limits.token_budget),
    ))


def machine_load(load: MachineLoad, loadavg_before: float, server_cpu_s: float) -> dict:
    """How busy the machine was during a sweep: load average, and each party's share of all the cores."""
    reading = load.reading
    capacity_s = reading.wall_s * reading.num_cpus
    server_percent = min(100.0, 100 * server_cpu_s / capacity_s)
    other_percent = max(0.0, reading.other_cpu_percent - server_percent)
    return {
        "loadavg_1min_before": round(loadavg_before, 2), "loadavg_1min_after": round(os.getloadavg()[0], 2),
        "num_cpus": reading.num_cpus, "wall_s": round(reading.wall_s, 1),
        "server_cpu_percent": round(server_percent, 1), "client_cpu_percent": round(reading.own_cpu_percent, 1),
        "other_cpu_percent": round(other_percent, 1), "busy": other_percent > BUSY_PERCENT,
    }


def sweep_one(
    name: str, start: Callable[[ServerLimits], ServerProcess], limits: ServerLimits, settings: LoadSettings
) -> ServerSweep:
    """Start one server, sweep it, stop it; a failure is kept as the sweep's ``error`` (Ctrl-C goes on up)."""
    result = ServerSweep(name)
    started = time.monotonic()
    print(f"{name}: starting the server", file=sys.stderr, flush=True)
    try:
        with start(limits) as server:
            result.command, result.pid = server.process.args, server.process.pid
            result.start_s = round(time.monotonic() - started, 1)
            print(f"{name}: up at {server.url} in {result.start_s:.0f} s; sweeping", file=sys.stderr, flush=True)
            loadavg_before, cpu_before = os.getloadavg()[0], server.cpu_s()
            with MachineLoad() as load:
                result.report = load_sweep(server.url, settings=settings, progress=print_progress,
                                           read_timeout_s=READ_TIMEOUT_S)
            result.machine = machine_load(load, loadavg_before, server.cpu_s() - cpu_before)
            print(file=sys.stderr)
    except PrefillVizError as error:  # the server did not start, or the probe could not run at all
        result.error = f"{type(error).__name__}: {error}"
        print(f"\n{name}: {result.error}", file=sys.stderr, flush=True)
    return result


def sweep_json(sweep: ServerSweep) -> dict:
    """One server's part of the printed JSON: each load point's figures, its TTFT split, its knee and the load."""
    report, settings = sweep.report, sweep.report.settings if sweep.report else None
    points = []
    for point in report.points if report else []:
        full = point.to_json(settings.ttft_target_s, settings.itl_target_s)
        points.append({**{key: full[key] for key in POINT_KEYS},
                       "split": {key: full["split"][key] for key in SPLIT_KEYS}})
    return {
        "command": [str(part) for part in sweep.command], "pid": sweep.pid, "start_s": sweep.start_s,
        "error": sweep.error,
        "server": report.server if report else None,
        "one_at_a_time_rate": report.one_at_a_time_rate if report else None,
        "load_points": points, "knee": knee_of(report), "stopped_reason": report.stopped_reason if report else None,
        "reading": report.reading() if report else None, "sweep_s": round(report.seconds, 1) if report else None,
        "machine": sweep.machine,
    }


def side_by_side(limits: ServerLimits, settings: LoadSettings) -> dict:
    """Both servers, one after the other, under the same sweep; the result the command prints."""
    if settings.mode != "rate" or not settings.loads:
        raise ValueError("the side-by-side runs an open-loop sweep (mode 'rate') at loads given up front")
    starters = {"ours": our_server, "vllm": vllm_server}
    problem = serve_device_problem()
    sweeps = {}
    for name in SERVERS:
        if name == "vllm" and problem:
            sweeps[name] = ServerSweep(name, error=f"{VLLMUnavailable.__name__}: {problem}")
            continue
        sweeps[name] = sweep_one(name, starters[name], limits, settings)
    servers = {name: sweep_json(sweep) for name, sweep in sweeps.items()}
    return {"limits": asdict(limits), "settings": asdict(settings), "servers": servers,
            "comparison": comparison(servers)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="our server and vllm serve under the same --load rate sweep")
    parser.add_argument("--loads", default=",".join(f"{load:g}" for load in DEFAULT_LOADS),
                        help="comma-separated offered loads, req/s (Poisson arrivals)")
    parser.add_argument("--dtype", default=ServerLimits.dtype)
    parser.add_argument("--max-num-seqs", type=int, default=ServerLimits.max_num_seqs)
    parser.add_argument("--token-budget", type=int, default=ServerLimits.token_budget, help="tokens per step")
    parser.add_argument("--requests-per-point", type=int, default=LoadSettings.requests_per_point)
    parser.add_argument("--prompt-tokens", type=int, default=LoadSettings.prompt_tokens)
    parser.add_argument("--output-tokens", type=int, default=LoadSettings.output_tokens)
    parser.add_argument("--max-seconds", type=float, default=LoadSettings.max_seconds, help="each sweep's bound")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the JSON on stdout (the table goes to stderr)")
    args = parser.parse_args(argv)
    try:
        loads = tuple(float(load) for load in args.loads.split(",") if load.strip())
    except ValueError:
        parser.error(f"--loads must be comma-separated numbers, got {args.loads!r}")
    settings = LoadSettings(
        mode="rate", loads=loads, requests_per_point=args.requests_per_point, prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens, max_seconds=args.max_seconds, seed=args.seed,
    )
    limits = ServerLimits(args.dtype, args.max_num_seqs, args.token_budget)

    def stop(*_):
        raise KeyboardInterrupt  # `kill`: the same way out as Ctrl-C, through each server's ``close``

    signal.signal(signal.SIGTERM, stop)
    try:
        settings.check()
        result = side_by_side(limits, settings)
    except KeyboardInterrupt:
        print("\nstopped; both servers are stopped", file=sys.stderr)
        sys.exit(130)
    except PrefillVizError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(side_by_side_table(result), file=sys.stderr if args.json else sys.stdout, flush=True)
    if args.json:
        print(json.dumps(result, indent=1))
    sys.exit(1 if any(server["error"] for server in result["servers"].values()) else 0)


if __name__ == "__main__":
    main()
