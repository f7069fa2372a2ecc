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
    assert all(r["tok_s"] > 0 and r["mfu_vs_measured_peak"] > 0 for r in prefill)  # a CPU's peak may be measured in a busy moment
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


def test_sizes_past_the_context_are_capped_so_the_context_edge_cannot_crash():
    """The bundled model's context is 8,192: a prefill of N = 8,192 plus its first token would be refused
    by the engine's request checks. Every size is capped at context - 1, and the cap is said."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from prefillviz.measure.gpu_check import TINY_LLAMA, _Tokenizer, prefill_figures, sizes_within_context

    model = LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, "max_position_embeddings": 64})).eval()
    assert sizes_within_context(model, (32, 64, 100)) == ([32, 63], 64)
    records = prefill_figures("tiny", model, _Tokenizer(), (32, 64, 100), torch.device("cpu"), peak_gflops=1e6, runs=1)
    assert "capped" in records[0]["note"]
    assert [r["N"] for r in records[1:]] == [32, 63] and all(r["ok"] for r in records)


def test_a_check_that_raises_is_one_failed_record_and_the_run_goes_on(capsys):
    from prefillviz.measure.gpu_check import _guarded

    assert _guarded("kernels", lambda: [{"check": "kernels", "ok": True}]) == [{"check": "kernels", "ok": True}]
    failed = _guarded("prefill", lambda: 1 / 0)
    assert failed == [{"check": "prefill", "error": "ZeroDivisionError: division by zero", "ok": False}]
    assert json.loads(capsys.readouterr().out.strip()) == failed[0]


def test_a_compiled_kernel_that_fails_to_build_is_skipped_with_its_reason(monkeypatch):
    """A Triton or FlexAttention compile failure is caught by a trial launch before any size runs:
    the kernel is listed as skipped with the error, and the other kernels are timed."""
    from prefillviz.kernels import paged_attention as paged
    from prefillviz.measure.kernel_bench import run_kernel_benchmark

    def broken(*args):
        raise RuntimeError("PassManager::run failed")  # what a Triton compile failure raises

    monkeypatch.setattr(paged, "FLEX", paged.PagedKernel("v4 flex", 4, "broken", broken, lambda device: (True, "claims to run")))
    bench = run_kernel_benchmark(4, 2, 16, sizes=(32,), device="cpu", families=("paged",), include_flex=True, runs=1)
    flex = [s for s in bench.skipped if s["kernel"] == "v4 flex"]
    assert flex and "trial launch failed" in flex[0]["reason"] and "PassManager::run failed" in flex[0]["reason"]
    assert {"v2 loop", "v3 packed"} <= {row["kernel"] for row in bench.rows()}
    assert "v4 flex" not in {row["kernel"] for row in bench.rows()}
