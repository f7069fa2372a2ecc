"""The command line a newcomer runs: real processes (an error case or two through ``main`` in this one), the bundled
model."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefillviz.backends.packed_weights import packing_status
from prefillviz.cli import main
from prefillviz.measure.bench_keys import BENCH_KEYS, KEY_NAMES, VLLM_KEYS

ROOT = Path(__file__).resolve().parents[2]
RUN_KEYS = [
    "model", "device", "dtype", "num_prompt_tokens", "prompt_token_ids",
    "first_token", "first_token_id", "time_to_first_token_s", "num_steps", "backend", "linear_layers", "forward",
    "dispatch", "dtype_note",
]


def prefillviz(*args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "prefillviz", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout
    )


def test_run_json_prints_exactly_the_documented_keys(bundled):
    result = prefillviz(
        "run", "--prompt", "The capital of France is", "--dtype", "float32", "--token-budget", "2", "--json"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert list(data) == RUN_KEYS
    assert data["first_token"] == " Paris" and data["first_token_id"] == 7042
    assert data["prompt_token_ids"] == [504, 3575, 282, 4649, 314]
    assert data["num_prompt_tokens"] == 5 and data["num_steps"] == 3  # chunks of 2
    assert data["dtype"] == "float32" and data["device"] == "cpu"
    assert data["time_to_first_token_s"] > 0
    # the measured choice: each of the 3 steps names what it ran, from the table's candidates
    dispatch = data["dispatch"]
    # 2 fresh tokens, 2 after cached ones, the last one alone
    assert [step["bucket"] for step in dispatch["steps"]] == ["prefill_128", "mixed", "decode"]
    for step in dispatch["steps"]:
        assert step["attention"] == dispatch["choices"][step["bucket"]]["attention"]
        assert step["attention"] in dispatch["timings_ms"][step["bucket"]]["attention"]


def test_run_on_the_textbook_backend_gives_the_same_token_and_measures_no_dispatch(bundled):
    result = prefillviz(
        "run", "--prompt", "The capital of France is", "--dtype", "float32", "--backend", "torch", "--json"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["backend"] == "torch" and data["first_token"] == " Paris"
    assert data["forward"] == "engine forward, textbook ops (plain torch)" and data["dispatch"] is None
    assert data["linear_layers"].startswith("stock linear layers (--backend torch")


def test_run_imports_nothing_it_does_not_need(bundled):
    """A cold ``run`` pays for every import (cold_start_s): not the app's, the figures' or pandas'."""
    command = [
        sys.executable, "-X", "importtime", "-m", "prefillviz", "run", "--prompt", "Hi", "--dtype", "float32", "--json"
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {
        line.rpartition("|")[2].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    unneeded = {
        "streamlit", "plotly", "pandas", "prefillviz.ui", "prefillviz.figures", "prefillviz.lessons",
        "prefillviz.measure.bench",
    }
    assert imported and not imported & unneeded, sorted(imported & unneeded)


def test_run_errors_are_one_line_for_people(capsys):
    # a real process: its exit status and its last line
    result = prefillviz("run", "--prompt", "  ", "--dtype", "float32")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "error: The prompt is empty: type some text to run the model on."
    # the rest through the same main() in this process (a process each costs ~5 s of imports)
    assert main(["run", "--prompt", "hi", "--token-budget", "0"]) == 2
    assert "token_budget must be a positive" in capsys.readouterr().err
    assert main(["run", "--prompt", "hi", "--model", "/no/such/folder"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in stderr


def test_trace_command_writes_a_trace_that_reloads(bundled, tmp_path):
    from prefillviz.instrument.trace_io import load_trace

    result = prefillviz(
        "trace", "--prompt", "The capital of France is", "--dtype", "float32", "--level", "inspect", "--out",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["files"] == ["arrays.npz", "trace.json"]
    trace = load_trace(tmp_path)
    assert trace.capture_level == "inspect" and trace.captured_qk["req-0"].queries[0].shape == (9, 5, 64)


@pytest.mark.bench
def test_bench_json_has_the_documented_keys(bundled):
    """The whole bench on its quick sizes: the keys and the JSON's shape (the figures are make bench's)."""
    result = prefillviz(
        "bench", "--json", "--quick", "--num-tokens", "24", "--runs", "2", "--dtype", "float32", "--no-vllm"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["quick"] is True  # nobody reads these as figures
    assert list(data) == list(KEY_NAMES)  # exactly the declared keys, in their order
    figures = [key.name for key in BENCH_KEYS if key.kind == "figure"]
    assert all(
        isinstance(data[k], (int, float)) and math.isfinite(data[k]) and data[k] > 0 for k in figures
    ), {k: data[k] for k in figures}
    # left out, and why
    assert all(data[k] is None for k in VLLM_KEYS) and "--no-vllm" in data["details"]["vllm"]["skipped"]
    # a fresh process with the model loaded (quick: a short inspect)
    assert 300 < data["inspect_4096_peak_rss_mb"] < 3 * 1024
    assert data["prefill_achieved_gflops"] > 0 and data["gemm_peak_gflops"] > 0
    peer = data["details"]["hf_continuous_batching"]
    assert peer["outputs_compared"] == len(peer["prompt_lengths"]) >= 2
    assert peer["outputs_equal"] == peer["outputs_compared"]  # fp32: the same greedy tokens as HF's own
    assert data["sequential_over_parallel"] > 1  # 24 steps cost more than one
    # what the engine ran
    assert set(data["dispatch"]["choices"]) == {"decode", "mixed", "prefill_128", "prefill_512", "prefill_2048"}
    assert data["details"]["hf_forward_s"]["runs"] == 2
    packing = data["details"]["packed_weights"]  # the engine's CPU linears, against stock, at 1, 32 and N tokens
    applies, why = packing_status(bundled.model)  # fp32 packs on every x86 CPU we know of, but the probe decides
    if applies:
        assert packing["applies"] and set(packing) == {"applies", "1_tokens", "24_tokens"}
    else:
        assert packing == {"applies": False, "why": why}
    assert data["details"]["cold_start_to_exit_s"]["median"] >= data["details"]["cold_start_s"]["median"]
    # vLLM's side of the bench is left out here (--no-vllm): tests/peer/test_vllm.py runs it on its worker
    assert data["details"]["vllm"] == {"skipped": "--no-vllm: the comparison with vLLM was left out"}
    assert all(
        data[key] is None for key in ("engine_over_vllm_prefill_512", "engine_over_vllm_decode", "vllm_outputs_equal")
    )


def test_an_unwritable_trace_folder_is_a_plain_error_before_the_model_loads(capsys, tmp_path):
    blocking_file = tmp_path / "a-file"
    blocking_file.write_text("not a folder")
    for folder, reason in (("/proc/nope", "No such file or directory"), (str(blocking_file / "x"), "Not a directory")):
        # the folder is checked first: the model is never loaded
        assert main(["trace", "--prompt", "hi", "--out", folder, "--model", "/no/such/model"]) == 2
        error = capsys.readouterr().err.strip()
        assert error == f"error: --out {folder}: Can't write to {folder} ({reason}): pick a folder you can write to."
