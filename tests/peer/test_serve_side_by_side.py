"""``python -m prefillviz.measure.serve_side_by_side``: our server and a real ``vllm serve``, each started,
swept at the same two loads and stopped, one after the other; the printed JSON has both sweeps whole, and
neither server is left running.

It starts its own ``vllm serve`` (the command's start and stop are what is tested), so the module's
time is mostly vLLM's start; the sweep is as small as the probe allows (2 requests per load)."""

import json
import os
import subprocess
import sys

import psutil

LOADS, REQUESTS_PER_POINT = (1.0, 2.0), 2


def test_both_servers_are_swept_alike_and_stopped(needs_vllm):
    command = [sys.executable, "-m", "prefillviz.measure.serve_side_by_side", "--json",
               "--loads", ",".join(f"{load:g}" for load in LOADS), "--requests-per-point", str(REQUESTS_PER_POINT),
               "--prompt-tokens", "64", "--output-tokens", "4", "--max-num-seqs", "4"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    print(done.stderr[-4000:])  # the table
    assert "knee (the heaviest load" in done.stderr and "the machine during each sweep:" in done.stderr

    assert set(result) == {"limits", "settings", "servers", "comparison"}
    assert result["limits"] == {"dtype": "float32", "max_num_seqs": 4, "token_budget": 2048}
    assert set(result["servers"]) == {"ours", "vllm"}
    for name, server in result["servers"].items():
        assert server["error"] is None, (name, server["error"])
        assert [p["load"] for p in server["load_points"]] == list(LOADS), (name, server["stopped_reason"])
        for point in server["load_points"]:  # every request answered, every token streamed
            assert point["requests_ok"] == point["requests_sent"] == REQUESTS_PER_POINT, (name, point)
            assert point["ttft_s_p99"] >= point["ttft_s_p50"] > 0 and point["output_tokens_per_s"] > 0
            assert point["split"]["missing"] == [] and point["split"]["prefill_s_mean"] > 0, (name, point["split"])
        knee = server["knee"]  # on a busy machine a server may not keep up even at the lightest load
        assert (knee["load"] is None) if knee["below_sweep"] else (knee["load"] in LOADS), knee
        assert knee["requests_per_s"] > 0 and server["one_at_a_time_rate"] > 0
        machine = server["machine"]
        assert machine["num_cpus"] >= 1 and 0 <= machine["other_cpu_percent"] <= 100
        assert machine["server_cpu_percent"] > 0  # the server's own CPU, counted apart from the others'
    assert "vllm.entrypoints.openai.api_server" in result["servers"]["vllm"]["command"]
    assert result["servers"]["vllm"]["server"]["version"]  # vLLM's /version
    assert set(result["comparison"]) == {
        "ours_at_least_vllm_at_knee", "ours_over_vllm_requests_per_s_at_knee", "both_knees_reached"}
    assert isinstance(result["comparison"]["ours_at_least_vllm_at_knee"], bool)

    groups = {server["pid"] for server in result["servers"].values()}  # each server's process group
    left = [p.pid for p in psutil.process_iter() if _group(p.pid) in groups]
    assert not left, f"still running: {left}"


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
