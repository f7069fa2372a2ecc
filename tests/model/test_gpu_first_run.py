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
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_first_run.sh"), "--self-test", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    failed = [line for line in done.stdout.splitlines() if '"ok": false' in line]
    assert done.returncode == 0, "\n".join(failed) + "\n" + done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [c["check"] for c in summary["checks"]] == STEPS and summary["ok"]
    records = {r["check"]: r for r in map(json.loads, (out / "first_run.jsonl").read_text().splitlines())}
    assert records["equality"]["max_abs_diff"] <= records["equality"]["allowed"] and records["equality"]["same_greedy_token"]
    edge = records["edge"]
    assert edge["first_token"] and "context of 512 tokens" in edge["context_refused_with"]  # context - 1 runs, context is refused
    assert records["inspect"]["kv_write_layers"] == records["inspect"]["captured_qk_layers"] == 4
    assert (out / "versions.json").is_file() and (out / "triton_tests.txt").is_file() and (out / "profile" / "chrome_trace.json").is_file()
    gpu_check = [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines()]
    assert gpu_check[-1]["check"] == "summary" and gpu_check[-1]["ok"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="there is a GPU here")
def test_without_a_gpu_it_says_to_use_the_self_test(capsys, tmp_path):
    from prefillviz.measure.gpu_first_run import main

    assert main(["--out", str(tmp_path)]) == 2 and "--self-test" in capsys.readouterr().err
