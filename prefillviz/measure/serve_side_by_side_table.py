"""The side-by-side's table: per load, each server's throughput, TTFT and TTFT split; then each one's knee,
the verdict, and how busy the machine was during each sweep. It reads ``serve_side_by_side``'s JSON only.
"""

from __future__ import annotations

HEADER = ("   load  server  ok/sent   req/s  out tok/s  TTFT p50  p99 ms   waiting ms  prefill ms  waiting share")


def _ms(seconds: float | None, width: int) -> str:
    return f"{'—':>{width}}" if seconds is None else f"{seconds * 1e3:{width}.0f}"


def _number(value: float | None, width: int, digits: int) -> str:
    return f"{'—':>{width}}" if value is None else f"{value:{width}.{digits}f}"


def _point_row(load_text: str, name: str, point: dict | None) -> str:
    if point is None:
        return f"{load_text}  {name:<6}  not swept (the sweep stopped before it)"
    split = point["split"]
    share = split["queue_share"]
    return (f"{load_text}  {name:<6}  {point['requests_ok']:>3}/{point['requests_sent']:<3}"
            f"  {_number(point['requests_per_s'], 6, 2)}  {_number(point['output_tokens_per_s'], 9, 1)}"
            f"  {_ms(point['ttft_s_p50'], 8)}  {_ms(point['ttft_s_p99'], 6)}"
            f"   {_ms(split['waiting_s_mean'], 10)}  {_ms(split['prefill_s_mean'], 10)}"
            f"  {'—' if share is None else f'{share:.0%}':>13}")


def _knee_text(server: dict) -> str:
    knee = server["knee"]
    if knee is None:
        return "none (no load point finished)"
    achieved = (f"{_number(knee['requests_per_s'], 0, 2)} req/s, {_number(knee['output_tokens_per_s'], 0, 1)} "
                f"out tok/s achieved, TTFT p99 {_ms(knee['ttft_s_p99'], 0)} ms")
    if knee["below_sweep"]:
        lightest = server["load_points"][0]["load"]
        return (f"below the loads swept (it did not keep up with the lightest, {lightest:g} req/s); the most it "
                f"served, at {knee['served_most_at']:g} req/s: {achieved}")
    bound = "" if knee["reached"] else " or more (no heavier load went past it)"
    return f"{knee['load']:g} req/s{bound}: {achieved}"


def _verdict(comparison: dict) -> str:
    at_least = comparison["ours_at_least_vllm_at_knee"]
    if at_least is None:
        return "ours against vllm at the knee: no verdict (a sweep is missing)"
    ratio = comparison["ours_over_vllm_requests_per_s_at_knee"]
    text = (f"ours' throughput at the knee is at least vllm's: {'yes' if at_least else 'no'}"
            f" (req/s achieved at the knees, ours / vllm: {_number(ratio, 0, 2)}×)")
    if not comparison["both_knees_reached"]:
        text += "; a knee not reached is a lower bound, heavier loads would tell more"
    return text


def _machine_text(name: str, machine: dict | None) -> str:
    if machine is None:
        return f"  {name}: not measured"
    return (f"  {name}: load average {machine['loadavg_1min_before']:.2f} → {machine['loadavg_1min_after']:.2f}"
            f" (1 min, the server included); other processes {machine['other_cpu_percent']:.0f}% of the "
            f"{machine['num_cpus']} cores, the server {machine['server_cpu_percent']:.0f}%, the client "
            f"{machine['client_cpu_percent']:.0f}%, over {machine['wall_s']:.0f} s"
            f"{' (busy: the figures may be slower than this machine can do)' if machine['busy'] else ''}")


def side_by_side_table(result: dict) -> str:
    """The whole result as text: the conditions, one row per load and server, knees, verdict, machine load."""
    limits, settings, servers = result["limits"], result["settings"], result["servers"]
    names = list(servers)
    versions = ", ".join(
        f"{name}: {(servers[name]['server'] or {}).get('version') or 'version not reported'}" for name in names
    )
    lines = [
        f"prefillviz serve against vllm serve, one after the other, the same sweep ({versions})",
        f"bundled model, {limits['dtype']}; both: {limits['max_num_seqs']} requests at once, "
        f"{limits['token_budget']} tokens per step; Poisson arrivals (seed {settings['seed']}), "
        f"{settings['requests_per_point']} requests per load, prompts {settings['prompt_tokens']} "
        f"± {settings['prompt_spread']:.0%} tokens, {settings['output_tokens']} out",
        f"{'TTFT split (server /metrics, means)':>{len(HEADER)}}",
        HEADER,
    ]
    by_load = {name: {point["load"]: point for point in servers[name]["load_points"]} for name in names}
    for load in settings["loads"]:
        for index, name in enumerate(names):
            load_text = f"{load:7g}" if index == 0 else " " * 7
            lines.append(_point_row(load_text, name, by_load[name].get(load)))
    lines.append(f"knee (the heaviest load whose TTFT p99 stays within {settings['knee_factor']:g}× the lightest's):")
    lines += [f"  {name}: {_knee_text(servers[name])}" for name in names]
    lines.append(_verdict(result["comparison"]))
    lines.append("one at a time: " + ", ".join(
        f"{name} {_number(servers[name]['one_at_a_time_rate'], 0, 2)} req/s" for name in names
    ) + " · started in: " + ", ".join(
        f"{name} {_number(servers[name]['start_s'], 0, 0)} s" for name in names
    ))
    lines.append("the machine during each sweep:")
    lines += [_machine_text(name, servers[name]["machine"]) for name in names]
    for name in names:
        for what in ("stopped_reason", "error"):
            if servers[name][what]:
                lines.append(f"{name} {what.replace('_', ' ')}: {servers[name][what]}")
    return "\n".join(lines)
