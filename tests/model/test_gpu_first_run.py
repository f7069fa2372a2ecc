"""scripts/gpu_first_run.sh --self-test: every step of the first-GPU script runs on the CPU, small,
writes what it measured under one folder, and passes; without a GPU and without --self-test it
refuses with a clear message."""

import json
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["versions", "triton_tests", "prefill", "equality", "inspect", "profile", "edge", "gpu_check"]


def test_self_test_runs_every_step_and_writes_one_folder(bundled, tmp_path):
    out = tmp_path / "first_run"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_first_run.sh"), "--self-test", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    failed = [line for line in done.stdout.splitlines() if '"ok": false' in line]
    assert done.returncode == 0, "\n".join(failed) + "\n" + done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [c["check"] for c in summary["checks"]] == STEPS and summary["ok"]
    records = {r["check"]: r for r in map(json.loads, (out / "first_run.jsonl").read_text().splitlines())}
    assert records["equality"]["max_abs_diff"] <= records["equality"]["allowed"] and (
        records["equality"]["same_greedy_token"]
    )
    # the CPU-side subset ran
    assert records["triton_tests"]["exit"] == 0 and " passed" in records["triton_tests"]["summary"]
    edge = records["edge"]
    # context - 1 runs, context is refused
    assert edge["first_token"] and "context of 512 tokens" in edge["context_refused_with"]
    assert records["inspect"]["kv_write_layers"] == records["inspect"]["captured_qk_layers"] == 4
    assert (
        (out / "versions.json").is_file() and (out / "triton_tests.txt").is_file()
        and (out / "profile" / "chrome_trace.json").is_file()
    )
    check_gpu_check_records([json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines()])


def check_gpu_check_records(records: list[dict]) -> None:
    """scripts/gpu_check.sh --self-test, as gpu_first_run ran it: every check of the GPU script (prefill
    figures for the bundled model and a random Llama, clock agreement, the paged kernels, the Triton
    kernel under its interpreter when Triton is installed), and all passed."""
    checks = [r["check"] for r in records]
    assert (
        checks[0] == "machine" and checks[-1] == "summary"
        and records[-1] == {"check": "summary", "records": len(records) - 1, "failed": 0, "ok": True}
    )
    prefill = [r for r in records if r["check"] == "prefill" and "skipped" not in r]
    assert {r["model"] for r in prefill} == {"bundled:SmolLM2-135M-Instruct", "random tiny Llama"}
    # a CPU's peak may be measured in a busy moment
    assert all(r["tok_s"] > 0 and r["mfu_vs_measured_peak"] > 0 for r in prefill)
    clocks = [r for r in records if r["check"] == "clocks"]
    assert len(clocks) == 2 and all(
        "stock" in r["forward"] and len(r["same_pass_ratios"]) == r["passes"] == 3 for r in clocks
    )
    # on the CPU, each layer's perf_counter span lies inside its profiler scope (entered before it, left after)
    assert all(0 < r["same_pass_ratio"] <= 1.05 and r["across_passes_ratio"] > 0 for r in clocks)
    kernels = [r for r in records if r["check"] == "kernels" and "skipped" not in r]
    assert {(r["workload"], r["N"]) for r in kernels} == {
        ("prefill", 32), ("mixed", 32), ("prefill", 48), ("mixed", 48)
    }
    triton_check = next(r for r in records if r["check"] == "triton")
    try:
        import triton  # noqa: F401
    except ImportError:
        assert "skipped" in triton_check
    else:  # installed: checked under the interpreter against the oracle
        assert triton_check["mode"] == "triton interpreter" and triton_check["max_abs_diff"] <= triton_check["allowed"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="there is a GPU here")
def test_without_a_gpu_it_says_to_use_the_self_test(capsys, tmp_path):
    from prefillviz.measure.gpu_first_run import main

    assert main(["--out", str(tmp_path)]) == 2 and "--self-test" in capsys.readouterr().err
