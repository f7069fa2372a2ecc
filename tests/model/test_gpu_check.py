"""scripts/gpu_check.sh: without a GPU and without --self-test it refuses with a clear message; its
sizes stay within the model's context, and a failing check is a failed record, not a crash. Its
CPU-side self-test runs inside scripts/gpu_first_run.sh's (tests/model/test_gpu_first_run.py checks
every record of it), so the suite runs it once."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="there is a GPU here")
def test_without_a_gpu_the_script_says_to_use_the_self_test(capsys):
    # the script's main, in this process (the self-test above ran the script)
    from prefillviz.measure.gpu_check import main

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

    monkeypatch.setattr(
        paged, "FLEX", paged.PagedKernel("v4 flex", 4, "broken", broken, lambda device: (True, "claims to run"))
    )
    bench = run_kernel_benchmark(4, 2, 16, sizes=(32,), device="cpu", families=("paged",), include_flex=True, runs=1)
    flex = [s for s in bench.skipped if s["kernel"] == "v4 flex"]
    assert flex and "trial launch failed" in flex[0]["reason"] and "PassManager::run failed" in flex[0]["reason"]
    assert {"v2 loop", "v3 packed"} <= {row["kernel"] for row in bench.rows()}
    assert "v4 flex" not in {row["kernel"] for row in bench.rows()}


def test_clocks_compare_the_events_with_the_scopes_device_span_where_there_is_one():
    """Like with like: on a GPU the profiler side is each ``layers.i`` scope's device-side span (launch
    gaps included, as CUDA events count them), from its first kernel, or its nested scopes', to the
    last one's end; not its kernels' busy time, and not the trace's own annotation of ``layers.i``,
    which spans only the kernels launched outside its nested scopes. On a CPU, the scope's span."""
    import gzip

    from prefillviz.measure.trace_spans import scope_spans_s

    events = [
        {"cat": "user_annotation", "name": "layers.0", "ts": 0, "dur": 900},
        {"cat": "user_annotation", "name": "layers.0.attention", "ts": 100, "dur": 500},
        {"cat": "user_annotation", "name": "layers.1", "ts": 900, "dur": 800},
        # as an H200's trace had it: the layer's own annotation begins with the residual add, after the
        # norm's and the attention's kernels, which only their own annotations cover
        {"cat": "gpu_user_annotation", "name": "layers.0.input_layernorm", "ts": 50, "dur": 100},
        {"cat": "gpu_user_annotation", "name": "layers.0.attention", "ts": 160, "dur": 600},
        {"cat": "gpu_user_annotation", "name": "layers.0", "ts": 800, "dur": 250},
        {"cat": "gpu_user_annotation", "name": "layers.1", "ts": 1050, "dur": 1100},
        {"cat": "gpu_user_annotation", "name": "layers.1.mlp", "ts": 1500, "dur": 400},  # inside the layer's own
        {"cat": "gpu_user_annotation", "name": "layers.10", "ts": 5000, "dur": 400},  # another layer
        {"cat": "kernel", "name": "layers.0", "ts": 60, "dur": 10},
    ]
    trace = gzip.decompress(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    assert scope_spans_s(trace, 2) == ([1000e-6, 1100e-6], "gpu_user_annotation")
    cpu_only = json.dumps({"traceEvents": events[:3]}).encode()
    assert scope_spans_s(cpu_only, 2) == ([900e-6, 800e-6], "user_annotation")


def test_flex_attention_may_compile_every_shape_of_a_benchmark_and_the_limit_comes_back():
    import torch._dynamo.config as dynamo_config

    from prefillviz.measure.kernel_trials import recompile_limit

    before = dynamo_config.recompile_limit
    with recompile_limit(before + 10):
        assert dynamo_config.recompile_limit == before + 10
    with recompile_limit(1):  # never lowered
        assert dynamo_config.recompile_limit == before
    assert dynamo_config.recompile_limit == before


TABLES_ONCE = """
import json, torch
from prefillviz.kernels import paged_attention as paged
from prefillviz.kernels import paged_attention_triton as triton_kernel
runs, why = paged.TRITON.status("cpu")
built, real = [], triton_kernel.block_tables_from_slots
triton_kernel.block_tables_from_slots = lambda *args: built.append(1) or real(*args)
inputs = paged.random_step([(20, 1), (0, 23)], 4, 2, 16, block_size=16, seed=3, workload="mixed")
first, second = paged.TRITON(*inputs.arguments()), paged.TRITON(*inputs.arguments())
difference, allowed = paged.check_paged(paged.TRITON, inputs)  # the oracle's bound, from the dtype and the values' size
print(json.dumps({"runs": runs, "built": len(built), "same": bool(torch.equal(first, second)),
                  "vs_oracle": difference, "allowed": allowed}))
"""


def test_the_triton_kernel_builds_its_block_tables_once_per_step_not_in_each_timed_call():
    """Under Triton's interpreter (a process of its own: @triton.jit reads TRITON_INTERPRET when it decorates)."""
    pytest.importorskip("triton")

    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", TABLES_ONCE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["runs"] and result["built"] == 1 and result["same"] and result["vs_oracle"] <= result["allowed"]
