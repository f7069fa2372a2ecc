"""scripts/gpu_check.sh: its CPU-side self-test runs every check of the GPU script (prefill
figures for the bundled model and a random Llama, clock agreement, the paged kernels, the
Triton kernel under its interpreter when Triton is installed) and passes; without a GPU and
without --self-test it refuses with a clear message."""

import json
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def run_script(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_self_test_runs_every_check_and_passes(bundled, tmp_path):
    done = run_script("--self-test", "--profile-dir", str(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    checks = [r["check"] for r in records]
    assert checks[0] == "machine" and checks[-1] == "summary" and records[-1] == {"check": "summary", "records": len(records) - 1, "failed": 0, "ok": True}
    prefill = [r for r in records if r["check"] == "prefill" and "skipped" not in r]
    assert {r["model"] for r in prefill} == {"bundled:SmolLM2-135M-Instruct", "random tiny Llama"}
    assert all(r["tok_s"] > 0 and 0 < r["mfu_vs_measured_peak"] < 1 for r in prefill)
    clocks = [r for r in records if r["check"] == "clocks"]
    assert len(clocks) == 2 and all(r["median_layer_ratio"] > 0 for r in clocks)
    kernels = [r for r in records if r["check"] == "kernels" and "skipped" not in r]
    assert {(r["workload"], r["N"]) for r in kernels} == {("prefill", 32), ("mixed", 32), ("prefill", 48), ("mixed", 48)}
    triton_check = next(r for r in records if r["check"] == "triton")
    try:
        import triton  # noqa: F401
    except ImportError:
        assert "skipped" in triton_check
    else:  # installed: checked under the interpreter against the oracle
        assert triton_check["mode"] == "triton interpreter" and triton_check["max_abs_diff"] <= triton_check["allowed"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="there is a GPU here")
def test_without_a_gpu_the_script_says_to_use_the_self_test(capsys):
    from prefillviz.measure.gpu_check import main  # the script's main, in this process (the self-test above ran the script)

    assert main([]) == 2 and "--self-test" in capsys.readouterr().err
