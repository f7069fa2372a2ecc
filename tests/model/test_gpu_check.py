"""scripts/gpu_check.sh: without a GPU and without --self-test it refuses with a clear message; its
sizes stay within the model's context, and a failing check is a failed record, not a crash. Its
CPU-side self-test runs inside scripts/gpu_first_run.sh's (tests/model/test_gpu_first_run.py checks
every record of it), so the suite runs it once."""

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


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
