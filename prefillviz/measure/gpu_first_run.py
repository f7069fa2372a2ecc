"""``scripts/gpu_first_run.sh``: the first run on a GPU just lent, in one prepared go of at most 9 minutes.

Everything it measured goes under one output folder (``--out``, default ``out/gpu_first_run``):

    versions.json       python, torch, CUDA, Triton, transformers, the GPU and its driver, the commit
    triton_tests.txt    the Triton kernel's tests (tests/model/test_paged_attention_triton.py) on CUDA
                        (--self-test: its CPU-side tests only; the suite runs the file)
    first_run.jsonl     one JSON line per check, as printed:
                          prefill    one prefill on the engine (timing pass): TTFT, tok/s
                          equality   its first-token logits against the plain Hugging Face forward
                          inspect    one inspection pass: every layer's K/V writes and captured q/k
                          profile    one profiler pass: its busiest ops, its Chrome trace (profile/)
                          edge       the context's edge: N = context - 1 (+ 1 new token) runs,
                                     N = context is refused with a message, not a crash
    gpu_check.jsonl     then ``scripts/gpu_check.sh`` (its own checks), with what is left of the time
    summary.json        every check's ok and seconds; the exit status is 1 if any failed

The model is the bundled model's config (SmolLM2-135M) with random weights, in bf16: the weights
may not travel to a lent machine, and the shapes, the context and the timings are what matter.
``--self-test`` runs it all on the CPU, small (4 of its 30 layers, a 512-token context, fp32), to
prove the script before GPU time is spent on it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from prefillviz.analysis import rounding
from prefillviz.engine.errors import RequestError
from prefillviz.engine.request import SamplingParams
from prefillviz.experiments.one_request import one_request_engine
from prefillviz.instrument.capture import run_captured
from prefillviz.machine.devices import dtype_name, machine_name
from prefillviz.machine.timers import run_timed
from prefillviz.measure.gpu_check import _Tokenizer, device_for

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 540.0  # 9 minutes, all of it
SMOLLM2_135M = dict(  # HuggingFaceTB/SmolLM2-135M-Instruct's config.json, the shape only
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
    head_dim=64, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
    rms_norm_eps=1e-5,
)
SELF_TEST_CONFIG = {**SMOLLM2_135M, "num_hidden_layers": 4, "max_position_embeddings": 512}
PROMPT_TOKENS = {"gpu": 512, "self_test": 64}


class FirstRun:
    """Writes each check as a JSON line (to stdout and ``first_run.jsonl``) and keeps the summary."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.deadline = out, time.monotonic() + budget_s
        self.summary: list[dict] = []
        self.lines = (out / "first_run.jsonl").open("w")

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def check(self, name: str, run) -> dict:
        """``run()``'s record, timed; an exception is a failed record with its message, and the next check goes on."""
        start = time.monotonic()
        if self.left_s() <= 0:
            record = {"check": name, "skipped": "the 9-minute budget is spent", "ok": False}
        else:
            try:
                record = {"check": name, **run()}
            except Exception as error:  # noqa: BLE001 -- one broken check must not cost the others
                record = {"check": name, "error": f"{type(error).__name__}: {error}"[:500], "ok": False}
        record["seconds"] = round(time.monotonic() - start, 2)
        print(json.dumps(record), flush=True)
        self.lines.write(json.dumps(record) + "\n")
        self.lines.flush()
        self.summary.append({"check": name, "ok": record["ok"], "seconds": record["seconds"]})
        return record


def _command(args: list[str], timeout_s: float = 20.0) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
        return done.stdout.strip() if done.returncode == 0 else f"(exit {done.returncode})"
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"({type(error).__name__})"


def versions(device: torch.device, out: Path) -> dict:
    def version_of(module: str) -> str | None:
        try:
            return __import__(module).__version__
        except Exception:  # noqa: BLE001 -- not installed, or broken: said as None
            return None

    found = {
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None, "triton": version_of("triton"),
        "transformers": version_of("transformers"), "device": str(device), "device_name": machine_name(device),
        "cpu": machine_name("cpu"),
        "driver": _command(["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"]),
        "commit": _command(["git", "rev-parse", "HEAD"]),
    }
    (out / "versions.json").write_text(json.dumps(found, indent=2))
    return {**found, "ok": True}


SELF_TEST_TRITON = "block_tables or reference"  # the CPU-side tests: the suite runs the whole file itself


def triton_tests(out: Path, timeout_s: float, self_test: bool = False) -> dict:
    test = "tests/model/test_paged_attention_triton.py"
    # the self-test proves this step's plumbing, not the kernel again
    subset = ["-k", SELF_TEST_TRITON] if self_test else []
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test, *subset],
                              capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"tests": test, "error": f"did not finish in {timeout_s:.0f} s", "ok": False}
    (out / "triton_tests.txt").write_text(done.stdout + done.stderr)
    last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    return {"tests": test, "summary": last, "exit": done.returncode, "ok": done.returncode == 0}


def _prefill(model, token_ids: list[int], device: torch.device, level: str = "timing", profile_dir: str | None = None):
    engine = one_request_engine(model, _Tokenizer(), token_budget=16384, num_tokens=len(token_ids) + 1,
                                model_id="random SmolLM2-135M")
    engine.add_request(token_ids, SamplingParams(max_new_tokens=1))
    return run_timed(lambda: run_captured(engine, capture_level=level, profile_dir=profile_dir), device)


def prefill(model, token_ids, device) -> dict:
    _prefill(model, token_ids, device)  # warm-up
    runs = [_prefill(model, token_ids, device) for _ in range(3)]
    ttft = [next(iter(trace.requests.values())).time_to_first_token_s for _, trace in runs]
    median = statistics.median(seconds for seconds, _ in runs)
    return {"N": len(token_ids), "run_median_s": median, "ttft_median_s": statistics.median(ttft),
            "tok_s": len(token_ids) / median, "runs": len(runs),
            "measured": "timing pass (per-layer clocks), after one warm-up", "ok": all(t and t > 0 for t in ttft)}


@torch.inference_mode()
def equality(model, token_ids, device, dtype) -> dict:
    _, trace = _prefill(model, token_ids, device, level="none")
    engine_logits = torch.as_tensor(next(iter(trace.requests.values())).first_token_logits).float()
    reference = model(input_ids=torch.tensor([token_ids], device=device), logits_to_keep=1).logits[0, -1].float().cpu()
    difference = float((engine_logits - reference).abs().max())
    terms = rounding.longest_sum(model.config, len(token_ids))
    allowed = rounding.relative_bound(dtype, rounding.TWO_FORWARDS_STEPS, terms) * float(reference.abs().max())
    same = int(engine_logits.argmax()) == int(reference.argmax())
    return {"against": "plain Hugging Face forward, last position", "max_abs_diff": difference, "allowed": allowed,
            "tolerance": f"{rounding.describe(dtype, rounding.TWO_FORWARDS_STEPS, terms)}, "
                         "at max |logit| (analysis/rounding.py)",
            "same_greedy_token": same,
            "ok": difference <= allowed}


def inspect(model, token_ids, device) -> dict:
    _, trace = _prefill(model, token_ids, device, level="inspect")
    step = trace.steps[0]
    captured = next(iter(trace.captured_qk.values()))
    layers = model.config.num_hidden_layers
    writes = step.kv_writes
    written = [] if writes is None else list(writes.layers_written)
    return {"kv_write_layers": len(written), "kv_write_positions": 0 if writes is None else len(writes.positions),
            "kv_bytes_per_layer": None if writes is None else writes.bytes_per_layer,
            "captured_qk_layers": len(captured.keys),
            "ok": (written == list(range(layers)) and len(writes.positions) == len(token_ids)
                   and len(captured.keys) == layers)}


def profile(model, token_ids, device, out: Path) -> dict:
    _, trace = _prefill(model, token_ids, device, level="profile", profile_dir=str(out / "profile"))
    rows = trace.profile.op_table
    return {"top_ops": [row["op"] for row in rows[:5]], "chrome_trace": trace.profile.chrome_trace_path,
            "activities": trace.profile.activities,
            "ok": bool(rows) and Path(trace.profile.chrome_trace_path).is_file()}


def edge(model, device) -> dict:
    context = model.config.max_position_embeddings
    token_ids = torch.randint(10, model.config.vocab_size, (context,),
                              generator=torch.Generator().manual_seed(2)).tolist()
    seconds, trace = _prefill(model, token_ids[: context - 1], device, level="none")
    generated = next(iter(trace.requests.values())).output_token_ids
    try:
        _prefill(model, token_ids, device, level="none")
        refused = None
    except RequestError as error:
        refused = str(error)
    return {"context": context, "prefill_context_minus_1_s": seconds, "first_token": bool(generated),
            "context_refused_with": refused, "ok": bool(generated) and refused is not None}


def gpu_check(self_test: bool, out: Path, timeout_s: float) -> dict:
    args = [sys.executable, "-m", "prefillviz.measure.gpu_check", "--profile-dir", str(out / "gpu_check_profile")]
    try:
        done = subprocess.run(args + (["--self-test"] if self_test else []), capture_output=True, text=True,
                              timeout=max(timeout_s, 1), cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"gpu_check did not finish in the {timeout_s:.0f} s left", "ok": False}
    (out / "gpu_check.jsonl").write_text(done.stdout)
    (out / "gpu_check.stderr.txt").write_text(done.stderr)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    failed = [r["check"] for r in records if not r.get("ok")]
    return {"records": len(records), "failed": failed, "exit": done.returncode,
            "ok": done.returncode == 0 and bool(records)}


def model_checks(run: FirstRun, self_test: bool, device: torch.device, dtype: torch.dtype, out: Path) -> None:
    """prefill, equality, inspect, profile and edge on the bundled model's config with random weights."""
    torch.manual_seed(0)
    config = LlamaConfig(**(SELF_TEST_CONFIG if self_test else SMOLLM2_135M))
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    n = PROMPT_TOKENS["self_test" if self_test else "gpu"]
    token_ids = torch.randint(10, config.vocab_size, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    run.check("prefill", lambda: prefill(model, token_ids, device))
    run.check("equality", lambda: equality(model, token_ids, device, dtype))
    run.check("inspect", lambda: inspect(model, token_ids, device))
    run.check("profile", lambda: profile(model, token_ids, device, out))
    run.check("edge", lambda: edge(model, device))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--self-test", action="store_true", help="small, on the CPU: check the script itself")
    parser.add_argument("--out", default="out/gpu_first_run", help="the folder everything measured goes to")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S)
    args = parser.parse_args(argv)
    if (chosen := device_for(args.self_test)) is None:
        return 2
    device, dtype = chosen
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run = FirstRun(out, args.budget_s)
    run.check("versions", lambda: versions(device, out))
    run.check("triton_tests", lambda: triton_tests(out, timeout_s=min(180.0, run.left_s()), self_test=args.self_test))
    model_checks(run, args.self_test, device, dtype, out)  # the model is freed when it returns
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    run.check("gpu_check", lambda: gpu_check(args.self_test, out, run.left_s()))
    ok = all(item["ok"] for item in run.summary)
    (out / "summary.json").write_text(json.dumps({"ok": ok, "device": str(device), "dtype": dtype_name(dtype),
                                                  "checks": run.summary}, indent=2))
    print(json.dumps({"check": "summary", "ok": ok, "failed": [c["check"] for c in run.summary if not c["ok"]],
                      "out": str(out)}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
