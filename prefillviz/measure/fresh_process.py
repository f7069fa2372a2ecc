"""The bench's parts that need a fresh process: the cold start and the inspection's peak RSS.

``cold_start_s`` spawns ``python -m prefillviz run`` and reads the clock when its first
token is printed; ``inspect_peak_rss_mb`` spawns this module (``inspect-rss``), which loads
the model, inspects one prefill and prints its peak RSS, so nothing the bench process
already holds counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

from prefillviz.analysis.memory import peak_rss_bytes
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.instrument.capture import run_captured
from prefillviz.loading.models import load_model
from prefillviz.loading.prompts import bench_token_ids


def cold_start_s(model_id: str, device: str, dtype: str) -> tuple[float, float]:
    """A fresh ``python -m prefillviz run`` process (the model is in the prefillviz cache by now).

    Returns:
        (seconds from spawning it to the line with its first token on its stdout: start,
        imports, model load, prefill, sampling; seconds until it has exited, which adds the
        interpreter's teardown: freeing torch's and transformers' modules).
    """
    command = [sys.executable, "-m", "prefillviz", "run", "--prompt", "Hello", "--model", model_id, "--device", device,
               "--dtype", dtype, "--json"]
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
        line = process.stdout.readline()  # the CLI prints (and flushes) its result once the first token is sampled
        first_token_s = time.perf_counter() - start
        process.stdout.read()
        exit_code = process.wait()
        exited_s = time.perf_counter() - start
        if exit_code != 0 or not line.strip():
            errors.seek(0)
            raise RuntimeError(f"cold start run failed ({exit_code}): {errors.read().decode(errors='replace')[-2000:]}")
    json.loads(line)["first_token_id"]  # it really printed the result
    return first_token_s, exited_s


def inspect_peak_rss_mb(model_id: str, device: str, dtype: str, num_tokens: int) -> float:
    """Peak RSS of a fresh process that inspects a ``num_tokens`` prefill (model load included)."""
    command = [sys.executable, "-m", "prefillviz.measure.fresh_process", "inspect-rss", model_id, device, dtype,
               str(num_tokens)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["peak_rss_mb"]


def _inspect_rss_child(model_id: str, device: str, dtype: str, num_tokens: int) -> None:
    loaded = load_model(model_id, device=device, dtype=dtype)
    engine = one_request_engine(loaded.model, loaded.tokenizer, num_tokens)  # the KV cache sized as the app's
    engine.add_request(bench_token_ids(loaded.tokenizer, num_tokens))
    trace = run_captured(engine, capture_level="inspect")
    assert trace.captured_qk  # the captured arrays are alive while the peak is read
    print(json.dumps({"peak_rss_mb": peak_rss_bytes() / 2**20}))


if __name__ == "__main__" and sys.argv[1:2] == ["inspect-rss"]:
    _inspect_rss_child(*sys.argv[2:5], int(sys.argv[5]))
